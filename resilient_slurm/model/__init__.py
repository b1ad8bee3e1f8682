"""The model a run trains: one decoder, its pretrained weights, LoRA adapters, and FSDP2 sharding.

Modules, from the layers to the sharded model:
    decoder      a Llama-architecture decoder with Hugging Face parameter names, packed inputs
    pretrained   a Hugging Face Llama directory: config.json → ModelConfig, weights read by row ranges
    lora         LoRA adapters on a frozen base: the layer, where it goes, its initial values
    parallel     FSDP2: the model built on the meta device, sharded, each rank filling its own rows
"""
