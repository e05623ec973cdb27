"""Hugging Face transformers built from a config with random weights (no download), compiled
through the torch frontend, against eager PyTorch: static, and with a dynamic batch and
sequence length compiled once."""

import numpy as np
import pytest
import torch
from torch.export import Dim

import ember

transformers = pytest.importorskip("transformers")


def bert():
    cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, vocab_size=120,
                                  max_position_embeddings=64)
    return transformers.BertModel(cfg).eval()


def gpt2():
    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=120,
                                  n_positions=64, use_cache=False, bos_token_id=0,
                                  eos_token_id=0)
    return transformers.GPT2Model(cfg).eval()


@pytest.mark.parametrize("build", [bert, gpt2], ids=["bert", "gpt2"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_transformers(build, dynamic):
    torch.manual_seed(1)
    m = build()
    ids = torch.randint(0, 120, (2, 16))
    dyn = {"input_ids": {0: Dim("batch"), 1: Dim("seq", max=64)}} if dynamic else None
    tm = ember.compile(m, (ids,), dynamic_shapes=dyn)
    for shape in [(2, 16), (1, 5), (3, 33)] if dynamic else [(2, 16)]:
        x = torch.randint(0, 120, shape)
        out, ref = tm(x), m(x)
        assert type(out) is type(ref)
        np.testing.assert_allclose(out.last_hidden_state.numpy(),
                                   ref.last_hidden_state.detach().numpy(), rtol=1e-4,
                                   atol=1e-5)
