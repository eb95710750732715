"""The launch scripts' one helper: what Python already knows, asked from the shell without torch.

    python -m tsm_ds.cli.launch_helper QUERY [ARGS...]

``launch/common.sh`` calls it (``tsm_helper``) and keeps only what must be shell: ``exec``, traps,
``export``, the env files, the ``deepspeed`` / ``srun`` command lines. Not a ``tsm-ds`` command: it
builds no argparse parser and has no options, only positional queries (``sys.argv`` dispatch),
answers on stdout, and a message on stderr with exit status 2 (the scripts' "launch: ..." error
status). Importing it, and every query, leaves torch unimported (tested), so each answer takes a
fraction of a second. Queries:

=============================  =====================================================================
``accelerator``                ``cpu`` or ``cuda``: ``DS_ACCELERATOR``, else the torch-free CUDA check
                               (:func:`tsm_ds.utils.node.accelerator`)
``default-recipe``             the recipe without ``--deepspeed_config`` (``CONFIG``): ``cpu_fp32``
                               on the CPU accelerator, else ``gpu_fp16`` (training's own default)
``ranks-per-node [CPU_RANKS]`` ``NPROC``, else CPU_RANKS (default 1) on CPU, else the allocation's
                               or the visible GPUs
``threads RANKS``              ``THREADS CORES``: cores of the node (``SLURM_CPUS_ON_NODE`` or the
                               affinity) and cores / RANKS (training's own split)
``port [HOST [SSH_PORT]]``     ``20000 + SLURM_JOB_ID mod 20000`` under SLURM (every node the
                               same), else a free port here, checked free on HOST over ssh
``hosts HOSTFILE``             the hostfile's hosts, one a line, in order
``slots HOSTFILE [HOST]``      the ranks of HOST (default the first host)
``check-ssh HOSTFILE [PORT]``  ``ssh -o BatchMode=yes HOST true`` to every host; per failure ssh's
                               own words and the fix; status 2 when one failed
``launch-args KIND ARGS...``   the script's arguments (KIND ``single``, ``multi``, ``slurm``) as
                               shell assignments for ``eval``: launcher settings, ``LAUNCH_OPTS``,
                               ``TRAIN_ARGS``; an unknown launcher option stops with the accepted ones
``output-dir TRAIN_ARGS...``  training's ``--output-dir`` for these flags (its ``--config`` record's,
                               else ``runs``); a flag train.py would refuse stops here, status 2
``exit-code NAME``             the status of NAME (``preempted`` -> 75; :mod:`tsm_ds.utils.exits`)
``explain-exit CODE``          what an exit status of training or of the launcher means
=============================  =====================================================================

Launcher arguments (``launch-args``): the script's options first (``--opt VALUE`` or
``--opt=VALUE``), then ``--``, then train.py's flags. Without ``--``, the first of train.py's own
flags ends the launcher options (``train_single_node.sh --data d``). Anything else before ``--`` is
refused naming the options the script accepts (``--master-addr`` would otherwise reach train.py).
"""
from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence

from tsm_ds.utils import exits, hosts, node

__all__ = ["LAUNCH_OPTIONS", "SCRIPTS", "LaunchArgsError", "parse_launch_args", "train_output_dir", "answer",
           "main"]

#: launcher option -> the shell variable it sets (None: passed on to ``deepspeed`` in LAUNCH_OPTS)
LAUNCH_OPTIONS: dict[str, str | None] = {
    "--hostfile": "HOSTFILE", "--ssh_port": "SSH_PORT", "--master_addr": "MASTER_ADDR",
    "--master_port": "MASTER_PORT", "--num_gpus": "NPROC", "--nproc": "NPROC",
    "--include": None, "--exclude": None, "--num_nodes": None, "--launcher": None,
}

#: script kind -> (its file, the launcher options it accepts)
SCRIPTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "single": ("launch/train_single_node.sh",
               ("--master_port", "--num_gpus", "--nproc", "--include", "--exclude")),
    "multi": ("launch/train_multi_node.sh",
              ("--hostfile", "--ssh_port", "--master_addr", "--master_port", "--include", "--exclude",
               "--num_nodes", "--launcher")),
    "slurm": ("launch/slurm_train.sbatch",
              ("--master_addr", "--master_port", "--num_gpus", "--nproc", "--include", "--exclude")),
}


class LaunchArgsError(ValueError):
    """A script's arguments that cannot be launched (the message says what to type instead)."""


def _train_flags() -> tuple[str, ...]:
    """train.py's option strings, from its generated parser (the configuration tree; no torch)."""
    from tsm_ds.config import Config, build_parser
    from tsm_ds.config.commands import TRAIN

    return tuple(o for a in build_parser(TRAIN, Config)._actions for o in a.option_strings)


def _is_train_flag(arg: str, flags: Sequence[str]) -> bool:
    """``arg`` is one of train.py's flags: exact, ``--flag=value``, or an unambiguous prefix
    (argparse's abbreviations)."""
    name = arg.split("=", 1)[0] if arg.startswith("--") else arg
    if name in flags:
        return True
    return name.startswith("--") and len([f for f in flags if f.startswith(name)]) == 1


def parse_launch_args(kind: str, args: Sequence[str], *, train_flags: Sequence[str] | None = None
                      ) -> tuple[dict[str, str], list[str], list[str]]:
    """Split a launch script's arguments into launcher settings, options for ``deepspeed`` and
    train.py's flags.

    Args:
        kind: the script, a key of :data:`SCRIPTS`.
        args: its arguments (after ``--help`` was handled by the script).
        train_flags: train.py's option strings (None: from its parser).

    Returns:
        (settings, launch_opts, train_args): ``settings`` maps shell variables (``HOSTFILE``,
        ``SSH_PORT``, ``MASTER_ADDR``, ``MASTER_PORT``, ``NPROC``) to the values given;
        ``launch_opts`` the options passed on to ``deepspeed`` (``--include a:0``); ``train_args``
        everything after ``--`` (without ``--``: from the first of train.py's flags on).

    Raises:
        LaunchArgsError: an option the script does not accept (with the spelling it accepts when
            only the spelling differs, and the list of its options), one of train.py's flags before
            ``--``, a launcher option without its value, an unknown kind.
    """
    if kind not in SCRIPTS:
        raise LaunchArgsError(f"unknown script kind {kind!r}: one of {', '.join(SCRIPTS)}")
    script, accepted = SCRIPTS[kind]
    flags = _train_flags() if train_flags is None else tuple(train_flags)
    settings: dict[str, str] = {}
    launch_opts: list[str] = []
    args = list(args)
    has_sep = "--" in args
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return settings, launch_opts, args[i + 1:]
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name in accepted:
            if not eq:
                if i + 1 >= len(args) or args[i + 1] == "--":
                    raise LaunchArgsError(f"{script}: {name} needs a value ({name} VALUE or {name}=VALUE)")
                value = args[i + 1]
                i += 1
            var = LAUNCH_OPTIONS[name]
            if var:
                settings[var] = value
            else:
                launch_opts += [name, value]
            i += 1
            continue
        if not has_sep and _is_train_flag(arg, flags):   # no '--': train.py's flags from here on
            return settings, launch_opts, args[i:]
        raise LaunchArgsError(_unknown(script, accepted, arg, flags, has_sep))
    return settings, launch_opts, []


def _unknown(script: str, accepted: Sequence[str], arg: str, flags: Sequence[str], has_sep: bool) -> str:
    def key(option: str) -> str:
        return option.lstrip("-").replace("-", "").replace("_", "")

    name = arg.split("=", 1)[0]
    listing = (f"its options: {', '.join(accepted)} (each with a value), then '--' and train.py's flags "
               "(python -m tsm_ds.train --help lists them)")
    same = next((o for o in accepted if key(o) == key(name)), None)
    if same and arg.startswith("-"):
        return f"{script}: unknown option {name}: the launcher option is spelled {same}; {listing}"
    other = next((f for f, opts in SCRIPTS.values() if any(key(o) == key(name) for o in opts)), None)
    if other and arg.startswith("-"):
        return f"{script}: {name} is an option of {other}, not of this script; {listing}"
    if has_sep and _is_train_flag(arg, flags):
        return f"{script}: {name} is one of train.py's flags: put it after '--'; {listing}"
    what = f"option {name}" if arg.startswith("-") else f"argument {arg!r}"
    return f"{script}: unknown {what} (launcher options come first, train.py's flags after '--'); {listing}"


def _shell_assignments(settings: Mapping[str, str], launch_opts: Sequence[str], train_args: Sequence[str]) -> str:
    lines = [f"{k}={shlex.quote(v)}" for k, v in settings.items()]
    lines.append("LAUNCH_OPTS=(" + " ".join(shlex.quote(a) for a in launch_opts) + ")")
    lines.append("TRAIN_ARGS=(" + " ".join(shlex.quote(a) for a in train_args) + ")")
    return "\n".join(lines)


def train_output_dir(train_args: Sequence[str], environ: Mapping[str, str]) -> str:
    """Training's output folder for ``train_args``, as train.py will parse them (its generated
    parser; the ``--config`` record first, then the flags, then ``TSM_DS_*`` variables).

    Raises:
        ValueError: train.py would refuse the flags (argparse's message), or the ``--config``
            record cannot be read.
    """
    import contextlib
    import io

    from tsm_ds.config import Config, ConfigTreeError, parse
    from tsm_ds.config.commands import TRAIN
    from tsm_ds.config.record import load_run_config

    args = list(train_args)
    if "-h" in args or "--help" in args:
        args = [a for a in args if a not in ("-h", "--help")]
    path = next((a.split("=", 1)[1] for a in args if a.startswith("--config=")), None)
    if path is None and "--config" in args[:-1]:
        path = args[args.index("--config") + 1]
    err = io.StringIO()
    try:
        base = load_run_config(path)[0] if path else None
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            cfg, _ = parse(TRAIN, Config, args, base=base, env=environ)
    except SystemExit:
        msg = (err.getvalue().strip().splitlines() or ["bad flags"])[-1]
        raise ValueError(f"train.py's flags: {msg}") from None
    except (FileNotFoundError, ConfigTreeError) as e:
        raise ValueError(f"train.py's --config {path}: {e}") from None
    return str(cfg.output.output_dir)


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{what} {text!r} is not a number") from None


def _port_arg(text: str | None) -> int | None:
    return _int(text, "SSH port") if text else None


def answer(query: str, args: Sequence[str], environ: Mapping[str, str]) -> tuple[int, str, str]:
    """One query (module docstring) answered.

    Args:
        query: the query's name. args: its arguments. environ: the environment (``os.environ``).

    Returns:
        (exit status, stdout text, stderr text): 0 with the answer, or 2 with a message (a
        missing or malformed hostfile, a bad number, a host that ssh cannot reach, an unknown
        launcher option, an unknown query).
    """
    try:
        return _answer(query, list(args), environ)
    except (ValueError, FileNotFoundError) as e:
        return 2, "", f"launch: {e}"


def _need(args: list[str], n: int, usage: str) -> None:
    if len(args) < n:
        raise ValueError(f"usage: python -m tsm_ds.cli.launch_helper {usage}")


def _ranks_per_node(args: list[str], environ: Mapping[str, str]) -> tuple[int, str, str]:
    cpu = _int(args[0], "CPU_RANKS") if args else 1
    return 0, str(node.ranks_per_node(environ, cpu_ranks=cpu)), ""


def _threads(args: list[str], environ: Mapping[str, str]) -> tuple[int, str, str]:
    _need(args, 1, "threads RANKS")
    cores = node.node_cores(environ)
    return 0, f"{node.threads_per_rank(cores, _int(args[0], 'RANKS'))} {cores}", ""


def _port(args: list[str], environ: Mapping[str, str]) -> tuple[int, str, str]:
    if environ.get("SLURM_JOB_ID"):
        return 0, str(node.slurm_port(environ["SLURM_JOB_ID"])), ""
    host = args[0] if args else None
    ssh_port = _port_arg(args[1] if len(args) > 1 else None)
    for _ in range(5):
        port = node.free_port("")
        if not host or node.port_free_on(host, port, sys.executable, ssh_port=ssh_port):
            return 0, str(port), ""
    return 2, "", f"launch: no free port found on {host} in 5 tries: set MASTER_PORT (or --master_port)"


def _hosts(args: list[str], environ: Mapping[str, str]) -> tuple[int, str, str]:
    _need(args, 1, "hosts HOSTFILE")
    return 0, "\n".join(h for h, _ in hosts.read_hostfile(args[0], require_slots=True)), ""


def _slots(args: list[str], environ: Mapping[str, str]) -> tuple[int, str, str]:
    _need(args, 1, "slots HOSTFILE [HOST]")
    table = hosts.read_hostfile(args[0], require_slots=True)
    if len(args) < 2:
        return 0, str(table[0][1]), ""
    found = dict(table).get(args[1])
    if found is None:
        raise ValueError(f"host {args[1]} is not in {args[0]}")
    return 0, str(found), ""


def _check_ssh(args: list[str], environ: Mapping[str, str]) -> tuple[int, str, str]:
    _need(args, 1, "check-ssh HOSTFILE [SSH_PORT]")
    port = _port_arg(args[1] if len(args) > 1 else None)
    names = [h for h, _ in hosts.read_hostfile(args[0], require_slots=True)]
    problems = hosts.check_ssh(names, port)
    if not problems:
        return 0, "", ""
    err = [line for p in problems
           for line in (f"launch: ssh {p.host} failed: {p.error}", f"launch:   fix: {p.fix}")]
    err.append(f"launch: not every host of {args[0]} is reachable by ssh (NO_SSH_CHECK=1 skips this check)")
    return 2, "", "\n".join(err)


def _launch_args(args: list[str], environ: Mapping[str, str]) -> tuple[int, str, str]:
    _need(args, 1, "launch-args single|multi|slurm [ARGS...]")
    settings, opts, train = parse_launch_args(args[0], args[1:])
    return 0, _shell_assignments(settings, opts, train), ""


def _exit_code(args: list[str], environ: Mapping[str, str]) -> tuple[int, str, str]:
    _need(args, 1, "exit-code NAME")
    if args[0] not in exits.EXIT_CODES:
        raise ValueError(f"no exit status named {args[0]!r}: one of {', '.join(exits.EXIT_CODES)}")
    return 0, str(exits.EXIT_CODES[args[0]]), ""


def _explain_exit(args: list[str], environ: Mapping[str, str]) -> tuple[int, str, str]:
    _need(args, 1, "explain-exit CODE")
    return 0, exits.describe(_int(args[0], "exit status")), ""


#: query -> ``f(args, environ) -> (exit status, stdout text, stderr text)``
QUERIES = {
    "accelerator": lambda args, environ: (0, node.accelerator(environ), ""),
    "ops-cache": lambda args, environ: (0, node.ops_cache_dir(environ), ""),
    "default-recipe": lambda args, environ: (0, node.default_recipe(node.accelerator(environ)), ""),
    "ranks-per-node": _ranks_per_node,
    "threads": _threads,
    "port": _port,
    "hosts": _hosts,
    "slots": _slots,
    "check-ssh": _check_ssh,
    "launch-args": _launch_args,
    "output-dir": lambda args, environ: (0, train_output_dir(args, environ), ""),
    "exit-code": _exit_code,
    "explain-exit": _explain_exit,
}


def _answer(query: str, args: list[str], environ: Mapping[str, str]) -> tuple[int, str, str]:
    if query not in QUERIES:
        return 2, "", (f"launch: unknown query {query!r} of tsm_ds.cli.launch_helper: one of "
                       f"{', '.join(QUERIES)}")
    return QUERIES[query](args, environ)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tsm_ds.cli.launch_helper QUERY [ARGS...]``: print the answer (module docstring).

    Returns the query's exit status (0, or 2 with a message on stderr).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    code, out, err = answer(argv[0], argv[1:], os.environ)
    if out:
        print(out)
    if err:
        print(err, file=sys.stderr)
    return code


if __name__ == "__main__":
    from tsm_ds.cli.process_exit import exit_process
    exit_process(main())
