"""Data: the contamination audit (does any training text overlap the evaluation data?), its saved
reports, and the gate that refuses final-eval items in what a trial trains on."""
