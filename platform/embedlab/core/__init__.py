"""Core (the bottom layer): typed frozen configs and their defaults, errors, storage locations and URIs,
code identity, live metrics, and the BEIR task format every layer above reads. Imports nothing of embedlab
but itself."""
