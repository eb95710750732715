"""Doctor section ``verdict``: which bottleneck binds, by what factor, and what to change.

Per device and per optimizer step, following the scaling model of ``tsm-ds bench scale``
(step = max(data loading, compute + (1 - overlap) x all-reduce), overlap 0: the trainer
all-reduces after the backward pass):

- compute: ``step_s`` for a micro-batch of ``micro_batch`` clips (compute section);
- communication: ``allreduce_s`` per step (communication section; 0 when not measured);
- data: the loader alone with the cores-per-device workers, ``loader_clips_per_s`` (data section).

Whenever the data section measured, the first advice names the data format it measured and the
CPU cores one GPU needs at one core's rate (A100 ~300 training clips/s, H100/H200 ~600; sources:
:data:`tsm_ds.bench.data_formats.GPU_RATE_SOURCES`).

With ``R = micro_batch / (step_s + allreduce_s)`` (clips/s the device could train at):
**data-bound** when the loader delivers less than R (``factor`` = R / loader: how much faster
training would go if data kept up); else **communication-bound** when the all-reduce takes longer
than the compute (``factor`` = allreduce_s / step_s); else **compute-bound** (``factor`` =
loader / R: the loader's headroom).

Advice items are ``{"text", "numbers": [{"section", "key", "value", "shown"}]}``: every number in
a text is a value stored in a section's ``values`` (``value`` is that value, ``shown`` the text it
was printed as, by :func:`shown`), so each factor the advice quotes is a measured ratio in the JSON.
"""
from __future__ import annotations

from typing import Any

from tsm_ds.doctor.core import Context, section_result

__all__ = ["shown", "decide", "run"]

#: a change is advised (or called "no gain") from this measured factor on
GAIN = 1.05


def shown(value: float, kind: str = "factor") -> str:
    """How a number appears in the advice: factors ``x31`` / ``x3.1`` / ``x0.52``; ``count``: an
    integer; ``rate``: 3 significant digits."""
    if kind == "count":
        return str(int(value))
    if kind == "rate":
        return f"{value:.3g}"
    return f"x{value:.0f}" if value >= 10 else f"x{value:.1f}" if value >= 1 else f"x{value:.2f}"


class _Advice:
    """Builds one advice text from measured values (each number recorded with where it lives)."""

    def __init__(self, sections: dict[str, dict[str, Any]]):
        self.sections = sections
        self.numbers: list[dict[str, Any]] = []

    def n(self, section: str, key: str, kind: str = "factor") -> str:
        v = self.sections[section]["values"][key]
        s = shown(v, kind)
        self.numbers.append({"section": section, "key": key, "value": v, "shown": s})
        return s

    def done(self, text: str) -> dict[str, Any]:
        item = {"text": text, "numbers": self.numbers}
        self.numbers = []
        return item


def _vals(results: dict, name: str) -> dict[str, Any]:
    sec = results.get(name) or {}
    return sec.get("values", {}) if sec.get("status") == "ok" else {}


def decide(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The bound and its factor from the sections' values (no measuring: testable on stored JSON).

    Returns:
        ``{"bound": "data" | "compute" | "communication" | None, "factor", "train_clips_per_s",
        "compute_comm_clips_per_s", "comm_vs_compute"}`` (None where an input is missing).
    """
    c, d, m = _vals(results, "compute"), _vals(results, "data"), _vals(results, "communication")
    out: dict[str, Any] = {"bound": None, "factor": None, "train_clips_per_s": None,
                           "compute_comm_clips_per_s": None, "comm_vs_compute": None}
    if not c:
        return out
    t_c, b = c["step_s"], c["micro_batch"]
    t_m = m.get("allreduce_s") or 0.0
    r = b / (t_c + t_m)
    out["compute_comm_clips_per_s"] = r
    out["comm_vs_compute"] = t_m / t_c if m else None
    loader = d.get("loader_clips_per_s")
    if loader is not None and loader < r:
        out.update(bound="data", factor=r / loader, train_clips_per_s=loader)
    elif t_m > t_c:
        out.update(bound="communication", factor=t_m / t_c, train_clips_per_s=r)
    else:
        out.update(bound="compute", factor=(loader / r) if loader is not None else None, train_clips_per_s=r)
    return out


def _advice(results: dict, v: dict[str, Any], cuda: bool) -> list[dict[str, Any]]:
    secs = {**results, "verdict": {"values": v}}
    a = _Advice(secs)
    c, d, m = _vals(results, "compute"), _vals(results, "data"), _vals(results, "communication")
    out = []
    if "cores_per_gpu_a100" in d:
        t = (f"data format measured: {d.get('data_format', 'unknown')}; one core loads "
             f"{a.n('data', 'per_worker_clips_per_s', 'rate')} training clips/s, so feeding a GPU takes "
             f"{a.n('data', 'cores_per_gpu_a100', 'rate')} cores per A100 (~300 clips/s) and "
             f"{a.n('data', 'cores_per_gpu_h100', 'rate')} per H100/H200 (~600 clips/s)")
        if d.get("data_format") not in ("packed", None):
            t += "; `tsm-ds prepare SRC OUT` writes the training-ready packed format"
        out.append(a.done(t))
    if v["bound"] == "data":
        if "workers_needed" in d:
            out.append(a.done(f"needs {a.n('data', 'workers_needed', 'count')} loader workers per device to keep up "
                              f"with compute; this machine has {a.n('data', 'workers_available', 'count')} "
                              f"core(s) per device"))
        if "reencode_speedup" in d:
            if d["reencode_speedup"] >= GAIN:
                cmd = d.get("reencode_command", "tsm-ds prepare SRC OUT --short-side 256")
                t = (f"prepare with `{cmd}` and train on OUT: "
                     f"{a.n('data', 'reencode_speedup')} loader clips/s on a sample of "
                     f"{a.n('data', 'reencode_clips', 'count')} of your clips")
                if "workers_needed_reencoded" in d:
                    t += f" (then {a.n('data', 'workers_needed_reencoded', 'count')} workers per device)"
                out.append(a.done(t))
            else:
                cmd = d.get("reencode_command", "tsm-ds prepare SRC OUT --short-side 256")
                out.append(a.done(f"preparing (`{cmd}`) measured "
                                  f"{a.n('data', 'reencode_speedup')} on a sample: these files are already cheap "
                                  f"to decode; fewer frames per clip (--num-segments), a smaller --img-size or "
                                  f"more cores per device are what is left"))
    elif v["bound"] == "communication":
        out.append(a.done(f"the gradient all-reduce takes {a.n('verdict', 'comm_vs_compute')} the compute of a step"))
        if m.get("speedup_bf16", 0) >= GAIN:
            out.append(a.done(f"all-reduce in bf16 (`\"communication_data_type\": \"bf16\"`, as "
                              f"ds_configs/cpu_comm_bf16.json): {a.n('communication', 'speedup_bf16')} faster"))
        if m.get("speedup_onebit", 0) >= GAIN:
            out.append(a.done(f"1-bit compression (`tsm_ds.compression`, as ds_configs/cpu_fp32_onebit.json): "
                              f"{a.n('communication', 'speedup_onebit')} faster, "
                              f"{a.n('communication', 'bytes_ratio_onebit')} fewer bytes"))
        out.append(a.done("a larger micro-batch spreads the per-step all-reduce over more clips"))
    elif v["bound"] == "compute":
        for k in sorted(c):
            if not k.startswith("speedup_"):
                continue
            name = k[len("speedup_"):]
            if name == "threads_1" and c[k] < GAIN:
                continue          # measured on every multi-core CPU: advised only when it wins
            flag = {"channels_last": "`--channels-last`", "compile": "`--compile`",
                    "channels_last_compile": "`--channels-last --compile`",
                    "threads_1": "one torch thread per rank (`OMP_NUM_THREADS=1`; the cores are "
                                 "oversubscribed)"}.get(name, f"training in {name}")
            gain = "faster" if c[k] >= GAIN else "(no gain here)"
            out.append(a.done(f"{flag}: compute {a.n('compute', k)} {gain}"))
        if v["factor"] is not None and "workers_needed" in d:
            out.append(a.done(f"the loader has headroom ({a.n('verdict', 'factor')} of what compute takes): "
                              f"{a.n('data', 'workers_needed', 'count')} worker(s) per device would do"))
        if not cuda:
            out.append(a.done("compute runs on CPU cores here: a GPU is the change that matters "
                              "(`tsm-ds bench scale` predicts multi-GPU times)"))
    if m and v["bound"] != "communication":
        out.append(a.done(f"the gradient all-reduce ({m.get('recipe_method', 'fp32')}, {m.get('world_size')} ranks) "
                          f"adds {a.n('verdict', 'comm_vs_compute')} of a step's compute time"))
    if "pipeline_vs_alone" in d and d["pipeline_vs_alone"] < 0.9:
        out.append(a.done(f"loader and compute share the cores: together they ran "
                          f"{a.n('data', 'pipeline_clips_per_s', 'rate')} clips/s, "
                          f"{a.n('data', 'pipeline_vs_alone')} of the slower of the two alone"))
    if (results.get("communication") or {}).get("status") == "not_measured":
        out.append(a.done(f"communication was not measured (world size 1): "
                          f"`{results['communication']['values']['how']}`"))
    return out


def run(ctx: Context, results: dict) -> dict:
    """The ``verdict`` section (see the module docstring)."""
    v = decide(results)
    if v["bound"] is None:
        return section_result("verdict", title="Verdict", status="not_measured",
                              summary="no verdict: the compute section did not run or failed", values=v)
    v["advice"] = _advice(results, v, ctx.cuda)
    fac = f" by {shown(v['factor'])}" if v["factor"] is not None else ""
    what = {"data": "the loader delivers fewer clips than compute could train",
            "communication": "the gradient all-reduce takes longer than the compute of a step",
            "compute": ("the loader keeps up; compute sets the pace" if v["factor"] is not None
                        else "compute sets the pace (the loader was not measured)")}[v["bound"]]
    line = f"{v['bound']}-bound{fac}: {what} ({shown(v['train_clips_per_s'], 'rate')} clips/s per device)"
    return section_result("verdict", title="Verdict", summary=line, values=v,
                          rows=[{"advice": item["text"]} for item in v["advice"]])
