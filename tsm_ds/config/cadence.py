"""The syntax of ``--eval-every`` (the validation cadence of training), shared by the configuration
tree (which checks the text) and the trainer's cadence component (:mod:`tsm_ds.engine.loop.cadence`).

Three forms:

- ``epoch`` (the default): after every epoch;
- an integer ``N >= 1`` (``200``): after every optimizer step that is a multiple of ``N`` (global
  step count, across epochs; epoch ends are not evaluation points unless they fall on one);
- a decimal fraction of an epoch strictly between 0 and 1 (``0.25``: four times per epoch): after
  the first optimizer step of each epoch at which at least ``k x F`` of the epoch's steps are done
  (k = 1, 2, ...), and at the epoch's end.

The end of the run is always evaluated, on the whole validation set. ``1.0`` or ``2.5`` are refused
(neither a step count nor a fraction below one: write ``epoch`` or an integer).
"""
from __future__ import annotations

from fractions import Fraction

__all__ = ["parse_eval_every", "check_eval_every"]

_HELP = ("give an integer number of optimizer steps >= 1 (e.g. 200), a fraction of an epoch between 0 and 1 "
         "(e.g. 0.25: four times per epoch) or 'epoch'")


def parse_eval_every(text: str) -> tuple[str, int | Fraction | None]:
    """``--eval-every`` text -> ``(kind, value)``.

    Args:
        text: ``"epoch"``, ``"N"`` (optimizer steps) or ``"0.F"`` (fraction of an epoch).

    Returns:
        ``("epoch", None)``, ``("steps", N)`` (int >= 1) or ``("fraction", F)`` (exact
        :class:`fractions.Fraction`, 0 < F < 1: no rounding of ``0.1`` to a binary float).

    Raises:
        ValueError: any other text; the message names ``--eval-every`` and the three forms.
    """
    t = str(text).strip().lower()
    if t == "epoch":
        return "epoch", None
    if t.isdigit():
        if int(t) < 1:
            raise ValueError(f"--eval-every {text!r}: {_HELP}")
        return "steps", int(t)
    try:
        f = Fraction(t)
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"--eval-every {text!r}: {_HELP}") from None
    if "." not in t or not 0 < f < 1:
        raise ValueError(f"--eval-every {text!r}: {_HELP}")
    return "fraction", f


def check_eval_every(text: str) -> str:
    """The tree's converter of ``--eval-every``: the text, stripped and lower-cased, once
    :func:`parse_eval_every` accepts it.

    Raises:
        ValueError: text that :func:`parse_eval_every` refuses (its message; the parser shows it).
    """
    parse_eval_every(text)
    return str(text).strip().lower()
