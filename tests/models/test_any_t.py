"""TSM at any clip shape: a model built for T=8 runs clips of any T from the batch, and its outputs
and gradients are bit-equal to those of a model built for that T with the same weights."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tsm_ds.models import build_model

VARIANTS = {
    "tsm_blockres": dict(arch="resnet18"),
    "tsm_block": dict(arch="resnet18", shift_place="block"),
    "tsm_online": dict(arch="resnet18", shift="online"),
    "tsm_temporal_pool": dict(arch="resnet18", temporal_pool=True),
    "tsn": dict(arch="resnet18", shift=None),
    "tsm_mobilenet_v2": dict(arch="mobilenet_v2"),
}


def _run(model, x, y):
    model.zero_grad(set_to_none=True)
    out = model(x)
    F.cross_entropy(out, y).backward()
    return out.detach(), {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_any_t_equals_a_model_built_for_that_t(name, one_thread):
    opts = dict(VARIANTS[name])
    arch = opts.pop("arch")
    torch.manual_seed(0)
    built8 = build_model(arch, 5, num_segments=8, dropout=0.0, **opts).train()
    ts = range(2, 17, 2) if opts.get("temporal_pool") else range(2, 17)
    for t in ts:
        ref = build_model(arch, 5, num_segments=t, dropout=0.0, **opts).train()
        ref.load_state_dict(built8.state_dict())
        torch.manual_seed(t)
        x, y = torch.randn(2, t, 3, 16, 16), torch.tensor([1, 3])
        out_a, g_a = _run(built8, x, y)
        out_b, g_b = _run(ref, x, y)
        assert torch.equal(out_a, out_b), (name, t)
        assert g_a.keys() == g_b.keys()
        for k in g_a:
            assert torch.equal(g_a[k], g_b[k]), (name, t, k)
        built8.load_state_dict(ref.state_dict())   # the BatchNorm statistics moved alike: keep them equal


def test_the_built_t_is_unchanged_and_odd_t_refused_with_temporal_pool():
    m = build_model("resnet18", 3, num_segments=8, temporal_pool=True)
    with pytest.raises(ValueError, match="even number of frames per clip, got T=5"):
        m(torch.randn(1, 5, 3, 32, 32))
    m.eval()(torch.randn(1, 4, 3, 32, 32))
    m(torch.randn(1, 8, 3, 32, 32))
    assert m.config["num_segments"] == m.num_segments == 8
    segs = sorted({mod.num_segments for mod, _ in m._temporal})
    assert segs == [4, 8]   # after a forward at T=8: the built T, and T // 2 past the pool
