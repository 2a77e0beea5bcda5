"""The worker's tests share the job package's fresh databases (tests/jobs/conftest.py) and the
webhook receivers (tests/webhooks/conftest.py)."""

from tests.jobs.conftest import NO_PARITY, backend, postgres  # noqa: F401 (fixtures)
from tests.webhooks.conftest import receivers  # noqa: F401 (the fixture)
