"""Multi-view counting/averaging and the evaluation report, on models with known outputs."""
from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch

from tsm_ds.inference import eval_report, views


class KnownModel(torch.nn.Module):
    """logits[b] = [x, 2x, -x] with x = clip[b, 0, 0, 0, 0]; records the batch size of every call."""

    def __init__(self):
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(()))  # gives the model a device/dtype
        self.calls: list[int] = []

    def forward(self, clip):  # (B, T, 3, H, W)
        assert clip.dim() == 5
        self.calls.append(clip.shape[0])
        x = clip[:, 0, 0, 0, 0]
        return torch.stack([x, 2 * x, -x], dim=1) + self.anchor


def _views(values):
    """(N, V, T=2, 3, H=2, W=2) clips whose view (n, v) is filled with values[n][v]."""
    v = torch.tensor(values, dtype=torch.float32)
    return v[:, :, None, None, None, None].expand(*v.shape, 2, 3, 2, 2).contiguous()


def test_protocols_count_views_and_pick_official_sampling():
    assert views.view_protocol(1, 1) == views.ViewProtocol(1, 1, "tsn")
    twice = views.view_protocol(2, 1)
    assert twice.num_views == 2 and twice.sampling == "tsn" and twice.twice_sample
    assert twice.dataset_kwargs() == {"mode": "test", "sampling": "tsn", "num_clips": 2, "num_crops": 1,
                                      "full_res": False, "resize": "box", "twice_sample": True}
    dense = views.view_protocol(10, 3)
    assert (dense.num_views, dense.sampling) == (30, "dense")
    # --num-crops 3 without --full-res keeps its pre-issue-18 meaning: full resolution
    assert dense.dataset_kwargs() == {"mode": "test", "sampling": "dense", "num_clips": 10, "num_crops": 3,
                                      "full_res": True, "resize": "box"}
    assert views.view_protocol(1, 10).num_views == 10
    assert "30 views" in dense.describe()
    with pytest.raises(ValueError, match="num_clips=4"):
        views.view_protocol(4, 1)
    with pytest.raises(ValueError, match="num_crops=4"):  # 5 is an official count since issue 18
        views.view_protocol(1, 4)


def test_average_views_logits_and_prob_by_hand():
    # 2 videos x 2 views x 2 classes, video-major rows.
    scores = torch.tensor([[0.0, math.log(3.0)], [2.0, 0.0],   # video 0
                           [1.0, 1.0], [3.0, -1.0]])             # video 1
    logit_avg = views.average_views(scores, 2, "logits")
    assert torch.allclose(logit_avg, torch.tensor([[1.0, math.log(3.0) / 2], [2.0, 0.0]]))
    prob_avg = views.average_views(scores, 2, "prob")
    e2 = math.exp(2.0)
    p0 = [(0.25 + e2 / (e2 + 1)) / 2, (0.75 + 1 / (e2 + 1)) / 2]
    e4 = math.exp(4.0)
    p1 = [(0.5 + e4 / (e4 + 1)) / 2, (0.5 + 1 / (e4 + 1)) / 2]
    assert torch.allclose(prob_avg, torch.tensor([p0, p1]), atol=1e-6)
    assert torch.allclose(prob_avg.sum(1), torch.ones(2))
    # (N, V, K) input gives the same result as (N*V, K).
    assert torch.equal(views.average_views(scores.reshape(2, 2, 2), 2, "logits"), logit_avg)
    with pytest.raises(ValueError, match="whole number of videos"):
        views.average_views(scores[:3], 2)
    with pytest.raises(ValueError, match="average="):
        views.average_views(scores, 2, "max")


@pytest.mark.parametrize("max_clips, expected_calls", [(None, [6]), (4, [4, 2]), (1, [1] * 6)])
def test_multiview_forward_counts_every_view_once(max_clips, expected_calls):
    model = KnownModel()
    clip = _views([[1.0, 2.0, 6.0], [-3.0, 0.0, 0.0]])  # N=2, V=3
    fwd = views.MultiViewForward(3, "logits", max_clips=max_clips)
    out = fwd(model, clip)
    assert model.calls == expected_calls  # 6 clips = 2 videos x 3 views, each run once
    # mean of x over views: 3 and -1; logits [x, 2x, -x]
    assert torch.equal(out, torch.tensor([[3.0, 6.0, -3.0], [-1.0, -2.0, 1.0]]))


def test_multiview_forward_prob_average_and_single_view_layout():
    model = KnownModel()
    clip = _views([[0.0, 1.0]])
    out = views.MultiViewForward(2, "prob")(model, clip)
    p_view0 = torch.full((3,), 1 / 3)
    p_view1 = torch.softmax(torch.tensor([1.0, 2.0, -1.0]), 0)
    assert torch.allclose(out[0], (p_view0 + p_view1) / 2, atol=1e-7)
    # V = 1 accepts the plain (N, T, 3, H, W) layout of val mode
    plain = _views([[5.0], [7.0]])[:, 0]
    out1 = views.MultiViewForward(1)(KnownModel(), plain)
    assert torch.equal(out1[:, 0], torch.tensor([5.0, 7.0]))
    with pytest.raises(ValueError, match="V=3"):
        views.MultiViewForward(3)(KnownModel(), clip)


def test_confusion_and_mean_class_accuracy_by_hand():
    labels = np.array([0, 0, 0, 1, 1, 3])
    preds = np.array([0, 1, 0, 1, 1, 0])
    cm = eval_report.confusion_matrix(labels, preds, 4)
    assert cm.tolist() == [[2, 1, 0, 0], [0, 2, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]]
    acc = eval_report.per_class_accuracy(cm)
    assert acc[0] == pytest.approx(2 / 3) and acc[1] == 1.0 and np.isnan(acc[2]) and acc[3] == 0.0
    # class 2 has no video: left out of the mean
    assert eval_report.mean_class_accuracy(cm) == pytest.approx((2 / 3 + 1 + 0) / 3)
    with pytest.raises(ValueError, match="outside"):
        eval_report.confusion_matrix(np.array([4]), np.array([0]), 4)


def test_summarize_topk_by_hand():
    scores = np.array([[0.1, 0.5, 0.2, 0.0, 0.0, 0.0, 0.3],   # true 1: rank 0
                       [0.9, 0.1, 0.8, 0.7, 0.6, 0.5, 0.4],   # true 6: rank 5 -> miss top-5
                       [0.9, 0.1, 0.8, 0.7, 0.6, 0.5, 0.4],   # true 4: rank 3 -> top-5 hit
                       [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]])  # true 6: rank 0
    labels = np.array([1, 6, 4, 6])
    assert eval_report.true_class_rank(scores, labels).tolist() == [0, 5, 3, 0]
    m = eval_report.summarize(scores, labels)
    assert m["top1"] == 50.0 and m["top5"] == 75.0 and m["videos"] == 4
    # classes with videos: 1 (1/1), 4 (0/1), 6 (1/2)
    assert m["mean_class_accuracy"] == pytest.approx(100 * (1 + 0 + 0.5) / 3)


def test_write_eval_results_files(tmp_path):
    names = ["a", "b", "c"]
    scores = np.array([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [1.0, 0.0, 0.5]])
    labels = np.array([0, 2, 2])
    m = eval_report.write_eval_results(tmp_path / "res", scores=scores, labels=labels, class_names=names,
                                       paths=["x.mp4", "y.mp4", "z.mp4"], indices=np.array([0, 1, 2]),
                                       meta={"checkpoint": "ck.pt"})
    res = tmp_path / "res"
    j = json.loads((res / "metrics.json").read_text())
    assert j["top1"] == pytest.approx(100 / 3) and j["confusion_matrix"] == [[1, 0, 0], [0, 0, 0], [1, 1, 0]]
    assert j["meta"]["checkpoint"] == "ck.pt" and j["average"] == "logits"
    rows = list(csv.DictReader((res / "predictions.csv").open()))
    assert [r["pred_name"] for r in rows] == ["a", "b", "a"]
    assert [r["true_rank"] for r in rows] == ["1", "2", "2"]
    e = np.exp(scores[0] - 2.0)
    assert float(rows[0]["score"]) == pytest.approx(e[0] / e.sum(), abs=1e-6)
    conf = list(csv.reader((res / "confusion.csv").open()))
    assert conf[0] == ["true\\predicted", "a", "b", "c"] and conf[3] == ["c", "1", "1", "0"]
    per_class = list(csv.DictReader((res / "per_class.csv").open()))
    assert [p["videos"] for p in per_class] == ["1", "0", "2"] and per_class[1]["accuracy"] == ""
    png = (res / "confusion.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image
    assert matplotlib.image.imread(res / "confusion.png").shape[2] in (3, 4)
    assert not list(res.glob(".*tmp"))  # atomic writes leave no temporary files
    assert m["files"]["confusion.png"].endswith("confusion.png")
