"""Library: train, freeze, save and load the tokenizer (Hugging Face `tokenizers`)."""
