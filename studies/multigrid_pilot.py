"""The multigrid study's pilot: what one optimizer step costs through the trainer at the base shape and at
the long cycle's first shape, to estimate the whole study (``tsm-ds bench multigrid --help``).

Runs the study's own commands (:func:`tsm_ds.experiments.multigrid_study.plan.train_command`, seed 0) of
the base and of the 1.5-epoch-factor multigrid arm, each cut at ``--max-steps`` (its first steps: the
base shape 8 x 4 x 32 px, and the schedule's first stage, 32 clips x 2 frames x 24 px), one after the
other, one OpenMP thread, in the study's folder, with one evaluation at the end (precise BatchNorm,
then every validation clip). Writes ``pilot.json`` there (and with ``--results-dir`` a copy): per run
the process seconds, training seconds, evaluation and precise-BatchNorm seconds, start-up (the rest),
seconds per step by shape (TensorBoard), and the seconds per step of each shape that
:data:`~tsm_ds.experiments.multigrid_study.plan.COST_S` takes (:func:`summarize`).

    OMP_NUM_THREADS=1 taskset -c 1 python studies/multigrid_pilot.py --out-dir bench_out/multigrid
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    """Run the pilot; print and write ``pilot.json``. Returns 0, 1 when a run did not complete."""
    sys.path.insert(0, str(REPO))
    from tsm_ds.data.synthetic import make_demo_dataset
    from tsm_ds.experiments.large_batch.runs import portable, run_env, run_one
    from tsm_ds.experiments.multigrid_study.plan import MGSettings, arms, lb_settings, train_command, write_recipe
    from tsm_ds.experiments.multigrid_study.report import shape_times, timeline
    from tsm_ds.experiments.multigrid_study.study import _history, _spec
    from tsm_ds.utils.io import atomic_write_text, machine_info

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default="bench_out/multigrid")
    ap.add_argument("--base-steps", type=int, default=320, help="optimizer steps of the base pilot")
    ap.add_argument("--mg-steps", type=int, default=160, help="optimizer steps of the multigrid pilot")
    ap.add_argument("--results-dir", default=None, help="also copy pilot.json here")
    a = ap.parse_args(argv)
    s = MGSettings()
    out = Path(a.out_dir).resolve()
    data = make_demo_dataset(out / "data", **s.task.generator(), workers=1)
    rel = {k: (portable(v, out) if k != "classes" else v) for k, v in data.items()}
    recipe = Path("recipes") / write_recipe(out, s).name
    env = run_env(lb_settings(s), ops_dir=out / "torch_extensions")
    picks = {x.arm: x for x in arms(s) if x.seed == s.seeds[0]}
    runs, t = [], s.task
    for arm, steps in ((picks["base"], a.base_steps), (picks["mg_x1.5"], a.mg_steps)):
        cmd = [*train_command(arm, s, recipe, rel, Path("runs")), "--max-steps", str(steps),
               "--eval-every", str(steps)]
        spec = _spec(arm, s, recipe)
        spec = type(spec)(**{**spec.__dict__, "name": f"pilot_{arm.name}"})
        cmd[cmd.index("--run-name") + 1] = spec.name
        t0 = time.time()
        row = run_one(spec, cmd, out, env)
        tl = timeline(_history(out / "runs" / spec.name))
        shapes = shape_times(out / "runs" / spec.name, (t.num_segments, t.img_size, s.base_batch))
        train = tl[-1]["train_s"] if tl else None
        ev = sum(h["eval_s"] for h in tl)
        runs.append({"name": spec.name, "arm": arm.arm, "status": row["status"], "steps": row["steps"],
                     "process_s": row["wall_s"], "train_s": train, "eval_s": round(ev, 1),
                     "precise_bn_s": round(sum(float(h["precise_bn_s"] or 0) for h in tl), 1),
                     "start_s": None if train is None else round(row["wall_s"] - train - ev, 1),
                     "train_s_per_step": None if not train else round(train / row["steps"], 4), "shapes": shapes,
                     "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t0)),
                     "cmd": portable(cmd, out)})
        print(json.dumps(runs[-1], indent=1), flush=True)
    ok = all(r["status"] == "completed" for r in runs)
    rep = summarize(runs, machine_info())
    atomic_write_text(out / "pilot.json", json.dumps(portable(rep, out), indent=2) + "\n")
    if a.results_dir:
        Path(a.results_dir).mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(a.results_dir) / "pilot.json", json.dumps(portable(rep, out), indent=2) + "\n")
    print(json.dumps(rep["step_s"]))
    return 0 if ok else 1


def summarize(runs: list[dict], machine: dict) -> dict:
    """The pilot's report: the runs, and seconds of training per optimizer step by shape
    (``"<T>x<crop>x<clips>"``: a run's training seconds over its steps, each pilot run trains one shape)
    with the ratio to the base step and to the ideal (clips x frames x pixels over the base's)."""
    step_s, base = {}, None
    for r in runs:
        if r["status"] != "completed" or not r["shapes"]:
            continue
        sh = r["shapes"][0]
        gpx = sh["clips"] * sh["frames"] * sh["crop"] ** 2
        base = base or (r["train_s_per_step"], gpx)
        step_s[f"{sh['frames']}x{sh['crop']}x{sh['clips']}"] = {
            "train_s_per_step": r["train_s_per_step"], "compute_s": sh["compute_s"], "data_wait_s": sh["data_wait_s"],
            "over_base": round(r["train_s_per_step"] / base[0], 3), "ideal_over_base": round(gpx / base[1], 3)}
    return {"name": "multigrid_pilot", "runs": runs, "step_s": step_s, "machine": machine,
            "note": "training seconds exclude the start-up (imports, engine, decoding every clip into the cache) "
                    "and the evaluations; the first run's start-up includes building DeepSpeed's CPU op"}


if __name__ == "__main__":
    sys.exit(main())
