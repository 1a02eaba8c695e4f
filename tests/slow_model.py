"""A model whose factory takes its time, for signals that arrive during start-up.

``rte serve --model slow_model:slow_reference`` (with tests/ on PYTHONPATH)
writes the file named by ``RTE_TEST_LOADING`` once it is loading, then sleeps
``RTE_TEST_LOAD_S`` seconds before building the reference model.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from rte.models import ReferenceModel


def slow_reference(**settings: Any) -> ReferenceModel:
    Path(os.environ["RTE_TEST_LOADING"]).write_text("loading")
    time.sleep(float(os.environ.get("RTE_TEST_LOAD_S", "5")))
    return ReferenceModel(**settings)
