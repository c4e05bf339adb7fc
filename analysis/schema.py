"""The row schema: trialrows.schema, which the sweep writes with (kept here for analysis's API)."""
from trialrows.schema import (  # noqa: F401
    COLUMNS, REPLICATE, RESULT, ROLES, SCHEMA, SETTING, role, rows_table, settings, undeclared,
)
