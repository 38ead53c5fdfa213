"""Tuning records, the JSON-lines log that holds them (the history "best" is taken from) and
the SQLite store that many tuners write at once."""

from .database import Database
from .log import (MalformedRecordWarning, NoValidRecordError, RecordToFile, WorkloadSummary, best_records,
                  canonical_target, iter_records, load_best_record, load_records, measured_trace_keys, summarize)
from .record import (RECORD_VERSION, RecordFormatError, RecordVersionError, TuningRecord, trace_key,
                     workload_label)
from .sqlite import RecordStore, RecordToStore

__all__ = [
    "Database", "MalformedRecordWarning", "NoValidRecordError", "RecordToFile", "WorkloadSummary", "best_records",
    "canonical_target", "iter_records", "load_best_record", "load_records", "measured_trace_keys", "summarize",
    "RECORD_VERSION", "RecordFormatError", "RecordVersionError", "TuningRecord", "trace_key", "workload_label",
    "RecordStore", "RecordToStore",
]
