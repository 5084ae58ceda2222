"""Release packages: a checkpoint's encoder as a directory sentence-transformers loads.

`export.py` writes the package (`export_release`, `export_release_to`, `export_inference`);
`st_module.py` is the sentence-transformers module that loads it (`EmbedlabTransformer`).
A release's `modules.json` names that class by its stable path, `embedlab.st_module`, which
re-exports it from here: every release written before or after this package existed loads.
"""
