"""Progress bars for long pipelines: Spark tasks finishing on executors, and
steps of a loop that runs on the driver.

Tasks finish on executors and the driver only sees counts, so
``JobProgress`` tags the jobs it covers with a job group and polls the
status tracker twice a second.  ``StepProgress`` is the same bar for a loop
the caller advances itself (a decision loop per simulated step, say).
Both show done/total, elapsed time and an ETA, and draw nothing when
disabled, so ``--no-progress`` and tests stay quiet.  ``job_group`` and
``job_description`` name the jobs of a block in Spark's UI.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from typing import Iterator, Optional


@contextlib.contextmanager
def job_group(sc, group: str, description: str) -> Iterator[None]:
    """job_group puts the Spark jobs started in the block into one job group
    (one line in the UI's job list, cancellable together) and puts the
    previous group and description back."""
    old = (sc.getLocalProperty("spark.jobGroup.id"),
           sc.getLocalProperty("spark.job.description"))
    sc.setJobGroup(group, description)
    try:
        yield
    finally:
        sc.setLocalProperty("spark.jobGroup.id", old[0])
        sc.setLocalProperty("spark.job.description", old[1])


@contextlib.contextmanager
def job_description(sc, text: str) -> Iterator[None]:
    """job_description names the Spark jobs started in the block (the UI's
    Description column, e.g. ``write summary.parquet``) and puts the
    previous description back."""
    old = sc.getLocalProperty("spark.job.description")
    sc.setJobDescription(text)
    try:
        yield
    finally:
        sc.setLocalProperty("spark.job.description", old)


def _bar():
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress("[progress.description]{task.description}", BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn(), "eta",
                    TimeRemainingColumn(), transient=False)


class JobProgress:
    """JobProgress draws a bar over the finished tasks of the Spark jobs run
    inside its ``with`` block (one job group).  ``total`` is the number of
    tasks expected; the count never exceeds it."""

    def __init__(self, sc, label: str, total: int, enabled: bool = True,
                 group: Optional[str] = None):
        self.sc, self.label, self.total = sc, label, total
        self.group = group or f"{label}-{uuid.uuid4().hex}"
        self.enabled = enabled and total > 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def done(self) -> int:
        """Tasks of this job group finished so far (capped at total)."""
        tr = self.sc.statusTracker()
        n = 0
        for jid in tr.getJobIdsForGroup(self.group):
            info = tr.getJobInfo(jid)
            for sid in (info.stageIds if info else []):
                st = tr.getStageInfo(sid)
                if st:
                    n += st.numCompletedTasks
        return min(n, self.total)

    def _poll(self) -> None:
        with _bar() as bar:
            task = bar.add_task(self.label, total=self.total)
            try:
                while not self._stop.wait(0.5):
                    bar.update(task, completed=self.done())
                bar.update(task, completed=self.done())
            except Exception:   # noqa: BLE001
                # The session went away under the bar (Ctrl-C, a failed
                # job): the bar stops; the failure is the driver's to say.
                pass

    def __enter__(self) -> "JobProgress":
        self._old = (self.sc.getLocalProperty("spark.jobGroup.id"),
                     self.sc.getLocalProperty("spark.job.description"))
        self.sc.setJobGroup(self.group, self.label)
        if self.enabled:
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        # Jobs run after the block must not count toward (or be cancelled
        # with) this group: the group and description before it come back.
        self.sc.setLocalProperty("spark.jobGroup.id", self._old[0])
        self.sc.setLocalProperty("spark.job.description", self._old[1])


class StepProgress:
    """StepProgress draws a bar over ``total`` steps that the caller counts
    with ``advance()``."""

    def __init__(self, label: str, total: int, enabled: bool = True):
        self.label, self.total = label, total
        self.enabled = enabled and total > 0
        self.completed = 0
        self._bar = None
        self._task = None

    def advance(self, n: int = 1) -> None:
        self.completed += n
        if self._bar is not None:
            self._bar.update(self._task, completed=min(self.completed, self.total))

    def __enter__(self) -> "StepProgress":
        if self.enabled:
            self._bar = _bar()
            self._bar.__enter__()
            self._task = self._bar.add_task(self.label, total=self.total)
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
            self._bar = None
