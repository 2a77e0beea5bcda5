"""Third-party messages that say nothing to a person running the demo, filtered where each comes
from (its own logger, warning category or switch), never by turning logging off as a whole."""

from __future__ import annotations

import logging
import warnings


class _DropMessages(logging.Filter):
    def __init__(self, *starts: str) -> None:
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.starts)


def quiet_demo() -> None:
    """For the demo's own process, before Ray, Serve, peft or bitsandbytes are imported."""
    # bitsandbytes looks for an optional hub-fetched CPU kernel at import and warns when it is not
    # installed; the built-in CPU path it falls back to is the one used here (and there is no hub).
    logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_DropMessages("Failed to load CPU gemm_4bit_forward"))
    # serve.run() after our serve.start() (which sets the proxy location and port) says it reuses
    # the instance just started; and Serve's start/ready lines repeat the demo's own "openft API:" line.
    logging.getLogger("ray.serve").addFilter(
        _DropMessages("Connecting to existing Serve app", "Started Serve in namespace", "Application '"))
    # Ray's "Started a local Ray instance" line: the demo prints the dashboard's address itself.
    logging.getLogger("ray._private.worker").addFilter(_DropMessages("Started a local Ray instance"))
    # peft (0.17) still calls transformers' renamed property; nothing for a demo user to do.
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # "Loading weights" bars for each of the two tiny models
