"""The step annotations a profile recorded, for the tests of ``callbacks.Profile`` and fit's profiling."""

import glob
import warnings


def step_marks(logdir):
    """The ``step_num`` of every ``train`` StepTraceAnnotation in the one trace under ``logdir``, sorted."""
    from jax.profiler import ProfileData

    (path,) = glob.glob(str(logdir / "**" / "*.xplane.pb"), recursive=True)
    with warnings.catch_warnings():
        # jaxlib's event-stats type (a nanobind type without __module__) makes Python 3.12+
        # warn when an event's stats are first read: jaxlib's, not funcnet's.
        warnings.filterwarnings("ignore", "builtin type event_stats has no __module__", DeprecationWarning)
        return sorted(
            int(dict(ev.stats)["step_num"])
            for plane in ProfileData.from_file(path).planes
            for line in plane.lines
            for ev in line.events
            if ev.name == "train"
        )
