"""What a rank trains: the built-in model, Hugging Face models from configs, a user's factories, data."""
