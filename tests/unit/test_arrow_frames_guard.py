"""Every Arrow table the package hands to Spark goes through ``arrow_frame`` (PySpark 4.2's
``createDataFrame`` drops the rows after a table's first empty record batch): a ``createDataFrame``
call elsewhere must be one of the known calls on Python rows."""

from __future__ import annotations

import re
from pathlib import Path

import airflow_provider_checkpoint

ROWS_NOT_ARROW = {  # file: the calls there, each on a list of Python tuples
    "dataflow/interval_join.py": 1,
    "connectors/files/malformed.py": 1,
    "connectors/kafka/source.py": 1,
    "fileio/frames.py": 2,  # the helper itself
}


def test_arrow_tables_reach_spark_only_through_arrow_frame() -> None:
    root = Path(airflow_provider_checkpoint.__file__).parent
    found = {}
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        calls = len(re.findall(r"\.createDataFrame\((?!\[\])", text))
        if calls:
            found[path.relative_to(root).as_posix()] = calls
    assert found == ROWS_NOT_ARROW, "hand Arrow tables to Spark with fileio.frames.arrow_frame"
