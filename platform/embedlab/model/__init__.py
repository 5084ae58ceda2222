"""Library: the encoder, its MLM heads, pooling, encoding texts to embeddings and the FLOP model of
every pass. Imports with torch alone (no Ray, pandas or pyarrow)."""
