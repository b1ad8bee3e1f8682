import torch

from resilient_slurm.config import ModelConfig
from resilient_slurm.model.decoder import block_causal_mask, init_value, plain_model, token_loss_sum

CFG = ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                  max_seq_len=32)


def test_parameter_names_follow_hugging_face_llama():
    names = set(plain_model(CFG, seed=0).state_dict())
    expected = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for i in range(CFG.num_layers):
        p = f"model.layers.{i}."
        expected |= {p + s for s in (
            "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
            "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
            "input_layernorm.weight", "post_attention_layernorm.weight")}
    assert names == expected


def test_grouped_query_attention_shapes():
    sd = plain_model(CFG, seed=0).state_dict()
    head_dim = CFG.hidden_size // CFG.num_heads
    assert sd["model.layers.0.self_attn.q_proj.weight"].shape == (CFG.num_heads * head_dim, CFG.hidden_size)
    assert sd["model.layers.0.self_attn.k_proj.weight"].shape == (CFG.num_kv_heads * head_dim, CFG.hidden_size)


def test_same_seed_same_weights_and_different_seed_differs():
    a, b, c = (plain_model(CFG, seed=s).state_dict() for s in (1, 1, 2))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["lm_head.weight"], c["lm_head.weight"])


def test_causal_future_tokens_do_not_change_past_logits():
    model = plain_model(CFG, seed=0).eval()
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


def test_initial_values_depend_on_seed_and_name_only():
    """Every rank and every world size draws the same initial weights (FSDP2 fills its rows of them)."""
    a = init_value("model.layers.0.mlp.up_proj.weight", (8, 4), CFG, seed=1)
    assert torch.equal(a, init_value("model.layers.0.mlp.up_proj.weight", (8, 4), CFG, seed=1))
    assert not torch.equal(a, init_value("model.layers.1.mlp.up_proj.weight", (8, 4), CFG, seed=1))
    assert torch.equal(init_value("model.norm.weight", (4,), CFG, seed=1), torch.ones(4))


def test_packed_documents_do_not_see_each_other():
    model = plain_model(CFG, seed=0).eval()
    first, second = torch.randint(0, CFG.vocab_size, (1, 6)), torch.randint(0, CFG.vocab_size, (1, 5))
    packed = torch.cat((first, second), dim=1)
    positions = torch.cat((torch.arange(6), torch.arange(5)))[None]
    docs = torch.tensor([[0] * 6 + [1] * 5])
    with torch.no_grad():
        together = model(packed, positions, docs)
        assert torch.allclose(together[:, :6], model(first), atol=1e-6)
        assert torch.allclose(together[:, 6:], model(second), atol=1e-6)


def test_the_block_causal_mask_lets_padding_see_only_padding():
    mask = block_causal_mask(torch.tensor([[0, 0, 1, -1]]))[0, 0]
    assert mask.tolist() == [[True, False, False, False], [True, True, False, False],
                             [False, False, True, False], [False, False, False, True]]
