import torch

from resilient_slurm.config import ModelConfig
from resilient_slurm.workload.model import build_model, token_loss_sum

CFG = ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                  max_seq_len=32)


def test_parameter_names_follow_hugging_face_llama():
    names = set(build_model(CFG, seed=0).state_dict())
    expected = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for i in range(CFG.num_layers):
        p = f"model.layers.{i}."
        expected |= {p + s for s in (
            "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
            "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
            "input_layernorm.weight", "post_attention_layernorm.weight")}
    assert names == expected


def test_grouped_query_attention_shapes():
    sd = build_model(CFG, seed=0).state_dict()
    head_dim = CFG.hidden_size // CFG.num_heads
    assert sd["model.layers.0.self_attn.q_proj.weight"].shape == (CFG.num_heads * head_dim, CFG.hidden_size)
    assert sd["model.layers.0.self_attn.k_proj.weight"].shape == (CFG.num_kv_heads * head_dim, CFG.hidden_size)


def test_same_seed_same_weights_and_different_seed_differs():
    a, b, c = (build_model(CFG, seed=s).state_dict() for s in (1, 1, 2))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["lm_head.weight"], c["lm_head.weight"])


def test_causal_future_tokens_do_not_change_past_logits():
    model = build_model(CFG, seed=0).eval()
    x = torch.randint(0, CFG.vocab_size, (1, 16))
    y = x.clone()
    y[0, 10:] = (y[0, 10:] + 1) % CFG.vocab_size
    with torch.no_grad():
        assert torch.allclose(model(x)[0, :10], model(y)[0, :10])
        assert not torch.allclose(model(x)[0, 10:], model(y)[0, 10:])


def test_loss_ignores_masked_positions():
    logits = torch.randn(1, 4, 10)
    targets = torch.tensor([[-100, 3, -100, 5]])
    only = torch.tensor([[-100, 3, -100, -100]])
    assert token_loss_sum(logits, targets) > token_loss_sum(logits, only) > 0


def test_bfloat16_model_runs():
    model = build_model(ModelConfig(**{**CFG.__dict__, "dtype": "bfloat16"}), seed=0)
    assert model(torch.randint(0, CFG.vocab_size, (2, 8))).dtype == torch.bfloat16
