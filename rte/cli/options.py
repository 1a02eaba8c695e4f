"""Options several commands share: which daemon to use, or which model to launch.

``rte demo`` and ``rte play`` either attach to a running daemon (``--name``,
waiting ``--wait`` seconds for it) or launch one of ``--model`` on ``--device``;
these options are written once here so that both say the same.
"""

from __future__ import annotations

import argparse

from rte.models import model_choices


def add_daemon_choice(p: argparse.ArgumentParser, default_model: str) -> None:
    """``--name``, ``--wait``, ``--model`` and ``--device``, on ``p``."""
    p.add_argument("--name", help="attach to this running daemon instead of launching one")
    p.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="with --name: wait up to this long for that daemon to come up (default 0: "
        "it must be running)",
    )
    p.add_argument(
        "--model",
        default=default_model,
        help=f"a launched daemon's model: short name or module:factory (default "
        f"{default_model}); {model_choices()}",
    )
    p.add_argument("--device", help="where a launched daemon's model computes: cpu, cuda:N")
