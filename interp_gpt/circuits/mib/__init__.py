"""Circuits as the Mechanistic Interpretability Benchmark (MIB, circuit-localization track) scores them.

`format.py`: its graph files both ways (the EAP-IG code's JSON and `.pt`), the nine-circuit form and a
submission folder with a check; `tasks.py`: tasks read from local files in MIB's column layouts, and
built offline from templates; `score.py`: faithfulness at MIB's percentages, CPR and CMD, its four
interventions, a random-circuit baseline. Numbers equal MIB's code (MIB-circuit-track b759df3, EAP-IG
7af394a): `bench/mib_reference.py` runs it offline and tests compare.

Example:
    >>> from interp_gpt.circuits import eap_ig_scores
    >>> from interp_gpt.circuits.mib import induction_task, mib_score, mib_random_baseline, save_mib_graph
    >>> task = induction_task(model)
    >>> scores = eap_ig_scores(model, task.clean, task.corrupted, task.metric)
    >>> mib_score(model, task, scores).cpr, mib_random_baseline(model, task).cpr_mean
    >>> save_mib_graph("submission/ioi_gpt2/importances.json", model, scores)
"""

from __future__ import annotations

from .format import (
    MIB_MODELS,
    MIB_PERCENTAGES,
    MIB_TASKS,
    MIBGraph,
    check_mib_submission,
    load_mib_graph,
    mib_edge_name,
    mib_receivers,
    save_mib_circuits,
    save_mib_graph,
    write_mib_submission,
)
from .score import (
    MIB_INTERVENTIONS,
    MIBRandomBaseline,
    MIBScore,
    area_under_curve,
    mib_random_baseline,
    mib_score,
)
from .tasks import Task, induction_task, name_mover_task, read_task

__all__ = [
    "MIB_PERCENTAGES",
    "MIB_TASKS",
    "MIB_MODELS",
    "MIB_INTERVENTIONS",
    "MIBGraph",
    "MIBScore",
    "MIBRandomBaseline",
    "Task",
    "area_under_curve",
    "check_mib_submission",
    "induction_task",
    "load_mib_graph",
    "mib_edge_name",
    "mib_random_baseline",
    "mib_receivers",
    "mib_score",
    "name_mover_task",
    "read_task",
    "save_mib_circuits",
    "save_mib_graph",
    "write_mib_submission",
]
