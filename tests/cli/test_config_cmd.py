"""``tsm-ds config``: the resolved engine JSON, steps and per-group lrs for N ranks, without launching."""
from __future__ import annotations

import json
import math

import pytest

from tsm_ds.cli import config as cmd


def _run(capsys, *argv) -> tuple[int, str, str]:
    rc = cmd.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _json(capsys, *argv) -> dict:
    rc, out, err = _run(capsys, *argv, "--json")
    assert rc == 0, err
    return json.loads(out)


def test_paper_recipe_at_1536_ranks(capsys):
    """gpu_kinetics_1536: 12,288 clips on 1,536 GPUs, lr by the linear rule, from ImageNet weights
    (--pretrained: the new head at fc x5 / bias x10), 5 epochs of warm-up, gradients pre-divided."""
    r = _json(capsys, "--deepspeed_config", "gpu_kinetics_1536", "--world-size", "1536", "--train-samples", "240000",
              "--device", "cuda", "--pretrained", "resnet50-0676ba61.pth")
    assert (r["global_batch"], r["micro_batch"], r["accumulation"]) == (12288, 8, 1)
    lr = 0.02 * 12288 / 128   # the recipe's lr_scaling block: base 0.02 per 128 clips, linear
    assert r["ds_config"]["optimizer"]["params"]["lr"] == pytest.approx(lr) == pytest.approx(1.92)
    spe = math.ceil(240000 / 1536) // 8   # DistributedSampler's clips per rank / micro-batch, drop_last
    assert (r["steps_per_epoch"], r["total_steps"]) == (spe, spe * 50) == (19, 950)
    groups = {g["group"]: g for g in r["param_groups"]}
    assert list(groups) == ["weight", "bn", "fc_weight", "fc_bias"]   # resnet50's convs have no bias
    assert groups["fc_weight"]["lr"] == pytest.approx(5 * lr) and groups["fc_bias"]["lr"] == pytest.approx(10 * lr)
    assert groups["bn"]["weight_decay"] == 0.0 and groups["weight"]["weight_decay"] == pytest.approx(1e-4)
    assert groups["fc_weight"]["parameters"] == 2048 * 400 and groups["fc_bias"]["parameters"] == 400
    assert r["tsm_ds"]["lr_schedule"]["total_steps"] == 950 and "tsm_ds" not in r["ds_config"]
    assert r["tsm_ds"]["lr_schedule"]["warmup_steps"] == 5 * spe   # warmup_epochs 5 (Goyal et al.)
    assert r["ds_config"]["gradient_predivide_factor"] == pytest.approx(math.sqrt(1536), abs=1e-4)
    scratch = _json(capsys, "--deepspeed_config", "gpu_kinetics_1536", "--world-size", "1536", "--train-samples",
                    "240000", "--device", "cuda")   # from scratch: the head at the backbone's lr
    groups = {g["group"]: g for g in scratch["param_groups"]}
    assert groups["fc_weight"]["lr"] == pytest.approx(lr) and groups["fc_bias"]["lr"] == pytest.approx(2 * lr)


def test_cpu_recipe_batch_flags(capsys):
    base = ["--deepspeed_config", "cpu_fp32", "--world-size", "2", "--train-samples", "96", "--arch", "resnet18",
            "--batch-size", "8"]
    r = _json(capsys, *base)
    # micro-batch "auto": the largest divisor of the 4 clips per rank up to 8; accumulation the rest
    assert (r["global_batch"], r["micro_batch"]) == (8, 4)
    assert r["accumulation"] == 8 // (r["micro_batch"] * 2) == 1
    assert r["ds_config"]["optimizer"]["params"]["lr"] == pytest.approx(0.02 * 8 / 128)
    assert r["steps_per_epoch"] == math.ceil(96 / 2) // (4 * 1) == 12   # clips per rank / (micro x accumulation)
    r = _json(capsys, *base, "--micro-batch-size", "2", "--lr", "0.05", "--epochs", "3", "--warmup-steps", "4")
    assert (r["micro_batch"], r["accumulation"]) == (2, 2)
    assert [g["lr"] for g in r["param_groups"]] == pytest.approx([0.05 * g["lr_mult"] for g in r["param_groups"]])
    assert r["total_steps"] == 3 * 96 // 8 and r["tsm_ds"]["lr_schedule"]["warmup_steps"] == 4
    assert r["auto_filled"]["optimizer.params.lr"] == "0.05 (--lr)"


def test_report_lists_json_steps_and_groups(capsys):
    rc, out, _ = _run(capsys, "--deepspeed_config", "cpu_fp32", "--world-size", "4", "--train-samples", "64",
                      "--arch", "resnet18", "--batch-size", "16", "--micro-batch-size", "2", "--epochs", "30")
    assert rc == 0
    body = out[out.index("{"):out.index("\n}\n") + 2]
    assert json.loads(body)["gradient_accumulation_steps"] == 2
    assert "global batch 16 = micro-batch 2 x accumulation 2 x 4 ranks" in out
    assert "4 optimizer steps per epoch x 30 epochs: 120 optimizer steps" in out
    # step decay x0.1 at epochs 20 and 40 (the default): steps 81 (epoch 20 x 4 steps + 1) on, 0.1
    assert "1: 1, 81: 0.1, 120: 0.1" in out
    assert "| fc_bias | 2 |" in out   # from scratch: the head at the backbone's multipliers (--head-lr-mults auto)


@pytest.mark.parametrize("argv,message", [
    (["--deepspeed_config", "gpu_kinetics_1536", "--world-size", "1536", "--train-samples", "240000",
      "--device", "cuda", "--batch-size", "4096"], "--batch-size 4096 conflicts with the engine JSON"),
    (["--deepspeed_config", "gpu_kinetics_1536", "--world-size", "1000", "--train-samples", "240000",
      "--device", "cuda"],
     "train_batch_size 12288 is not divisible by train_micro_batch_size_per_gpu 8 x world size 1000"),
    (["--deepspeed_config", "cpu_fp32", "--world-size", "3", "--train-samples", "96", "--batch-size", "8"],
     "not divisible by the world size 3"),
    (["--deepspeed_config", "gpu_fp16", "--world-size", "2", "--train-samples", "96", "--device", "cpu"],
     "no fp16 training on this device (cpu)"),
    (["--deepspeed_config", "no_such_recipe", "--world-size", "2", "--train-samples", "96"],
     "engine JSON not found"),
])
def test_bad_combinations_exit_2(capsys, argv, message):
    rc, out, err = _run(capsys, *argv, "--arch", "resnet18")
    assert rc == 2 and out == ""
    assert message in err and err.startswith("tsm-ds config: ")


def test_resume_from_run_on_other_world_size(capsys, tmp_path):
    """A run saved by 2 ranks (global 8 = 2 x 2 x 2) previewed on 1 rank: global 8 kept, accumulation 4."""
    tag = tmp_path / "checkpoints" / "step00000004"
    tag.mkdir(parents=True)
    (tag / "complete.json").write_text(json.dumps({"step": 4, "world_size": 2, "global_batch": 8, "micro_batch": 2,
                                                   "accumulation": 2, "samples_in_epoch": 32, "files": {}}))
    r = _json(capsys, "--deepspeed_config", "cpu_fp32", "--world-size", "1", "--train-samples", "96",
              "--arch", "resnet18", "--resume-from", str(tmp_path))
    assert (r["global_batch"], r["micro_batch"], r["accumulation"]) == (8, 2, 4)
    assert "kept from step00000004" in r["auto_filled"]["train_batch_size"]


def test_dispatcher_and_shared_training_flags():
    """``tsm-ds config`` is a command, and its training flags are train's (the same fields of the tree)."""
    from tsm_ds.cli import COMMANDS
    from tsm_ds.cli.train import build_parser as train_parser

    assert COMMANDS["config"][0] == "tsm_ds.cli.config"

    def training(p):
        g = next(g for g in p._action_groups if g.title == "schedule")
        # a field's parse= converter is wrapped anew per parser: compared by name
        return {a.dest: (a.option_strings, getattr(a.type, "__name__", a.type), a.default) for a in g._group_actions}

    ours, train = training(cmd.build_parser()), training(train_parser())
    # what config leaves out (commands.PLAN names the schedule fields it uses): the seed, and the
    # validation cadence and batch and precise BatchNorm's batches, which change no resolved engine value
    left_out = {"schedule__seed", "schedule__eval_every", "schedule__eval_max_clips", "schedule__eval_batch_size",
                "schedule__precise_bn_batches"}
    assert set(train) >= left_out and not set(ours) & left_out
    assert {k: v for k, v in train.items() if k not in left_out} == ours
    assert set(ours) >= {f"schedule__{k}" for k in ("batch_size", "micro_batch_size", "grad_accum", "lr", "lr_steps")}

def test_multigrid_schedule_is_printed_as_the_trainer_builds_it(capsys):
    """--multigrid long on the Kinetics recipe at 16 ranks: the stage table and the total steps are
    build_schedule's for the resolved batch, epochs and lr steps; decay_epochs is emptied (the stages'
    lr factors decay the lr); a recipe without a stepwise lr is refused naming --multigrid."""
    from tsm_ds.engine.loop.multigrid import build_schedule

    assert cmd.main(["--deepspeed_config", "cpu_fp32", "--world-size", "16", "--train-samples", "240000",
                     "--batch-size", "128", "--arch", "resnet18", "--multigrid", "long", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    s = build_schedule(frames=8, crop=224, global_batch=128, epochs=50, lr_steps=[20, 40], mode="long")
    assert out["multigrid"] == {"epochs": 75, "total_steps": s.total_steps(240000), "stages": s.table(240000)}
    assert out["total_steps"] == s.total_steps(240000) and out["tsm_ds"]["lr_schedule"]["decay_epochs"] == []
    assert [r["frames"] for r in out["multigrid"]["stages"][:4]] == [2, 4, 4, 8]
    assert cmd.main(["--deepspeed_config", "cpu_sgd_cosine", "--world-size", "1", "--train-samples", "64",
                     "--multigrid", "long"]) == 2
    assert "--multigrid long needs a stepwise lr" in capsys.readouterr().err
