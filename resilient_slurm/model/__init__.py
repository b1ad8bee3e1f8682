"""The model a run trains: one decoder, its pretrained weights, LoRA adapters (sharding is parallel/).

Modules, from the layers to the sharded model:
    families     the supported families (Llama, Qwen2/2.5, Qwen3, Mistral) and their switches  [pure]
    decoder      the one decoder (Llama's layout and those switches), Hugging Face names, packed inputs
    pretrained   a Hugging Face directory: config.json → ModelConfig, weights read by row ranges
    lora         LoRA adapters on a frozen base: the layer, where it goes, its initial values
"""
