"""Training and evaluation of the embedded diffgemma-tiny model (corpus, tokenizer, config, loop, evaluation)."""
