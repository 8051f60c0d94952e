"""The reference engine: prepares a Llama-family model and runs it on the GrowPage core."""
