"""PostgreSQL fixtures (see tests/support/pg_fixture.py) and the member job's --py-files zip."""

from tests.support.iceberg_rest import rest_catalog  # noqa: F401,E402
from tests.support.member_job import member_job_zip  # noqa: F401
from tests.support.minio import minio_server, s3_bucket  # noqa: F401,E402
from tests.support.pg_fixture import postgres_db, postgres_server  # noqa: F401
from tests.support.spark_session import spark_session  # noqa: F401,E402
