"""Logs: in JSON mode every line is JSON, the standard library's too
(found in a trial: APScheduler's warnings came out as plain text inside a
JSON log)."""
import json
import subprocess
import sys


def test_every_line_of_a_json_log_is_json():
    code = ("from gpuscope.daemon import logs; import logging, structlog; logs.configure('info', True); "
            "logging.getLogger('apscheduler.scheduler').warning('Run time of job %s was missed', 'sweep'); "
            "logging.getLogger('apscheduler.scheduler').error('Job %s raised', 'sweep'); "
            "logging.getLogger('grpc').error('boom'); structlog.get_logger('gpuscope.x').info('hello', gpu=3); "
            "logging.getLogger('apscheduler.executors').info('not shown at info: libraries speak at warnings')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    lines = [json.loads(line) for line in r.stderr.splitlines()]
    assert [(x["level"], x["event"]) for x in lines] == [           # a late periodic job is not worth a line
        ("error", "Job sweep raised"), ("error", "boom"), ("info", "hello")]
    assert lines[0]["logger"] == "apscheduler.scheduler" and lines[2]["gpu"] == 3
