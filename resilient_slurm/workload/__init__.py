"""What the runtime trains: the model and the data.

Modules:
    model   a Llama-architecture decoder with Hugging Face parameter names
    data    a deterministic synthetic SFT dataset and the exact-position global batch sampler
"""
