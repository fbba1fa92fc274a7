"""``edgebroker-spark ingest --landing PATH --warehouse PATH [--checkpoint PATH]
[--once | --continuous [--interval S]] [--debug]``: the ingest job (edgebroker.spark.ingest) as
a command, run directly (Spark in local mode unless ``PYSPARK_SUBMIT_ARGS`` says otherwise) or
with ``spark-submit path/to/edgebroker/spark/cli.py ingest ...``. The master is never set here:
it comes from spark-submit or the Spark configuration. Each pass prints its report as one JSON
line. With ``--once`` a pass that fails is said in one line (its traceback is logged with
``--debug``) and the command exits 1; with ``--continuous`` it is logged (one line) and the next
interval tries again (also a pass refused because another holds the checkpoint folder's lock;
``--once`` then says so in one line and exits 1),
unless Spark itself is gone (its JVM ended on its own: the OOM killer, a crash): then the command
says so in one line and exits 1, for its service manager to start it again.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading

log = logging.getLogger("edgebroker.spark")

# The longest --interval: the wait between passes takes at most this (a day's passes or a
# week's are both far inside it).
MAX_INTERVAL = 1_000_000


def _interval(text: str) -> float:
    """An argparse ``type``: seconds above 0 and at most MAX_INTERVAL (inf failed after the
    first pass, nan ran passes back to back)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text}: not a number of seconds") from None
    if not 0 < value <= MAX_INTERVAL:
        raise argparse.ArgumentTypeError(f"{text}: must be above 0 and at most {MAX_INTERVAL} "
                                         f"seconds")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edgebroker-spark",
                                description="Turn edgebroker upload batches into Parquet tables.")
    sub = p.add_subparsers(dest="command", required=True)
    ing = sub.add_parser("ingest", help="ingest a landing area of upload batches")
    ing.add_argument("--landing", required=True, help="the landing area (path or URI)")
    ing.add_argument("--warehouse", required=True, help="where the Parquet tables go")
    ing.add_argument("--checkpoint", help="the job's bookkeeping (default <warehouse>/_checkpoint)")
    mode = ing.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="one pass, then exit (the default)")
    mode.add_argument("--continuous", action="store_true",
                      help="a pass every --interval seconds until SIGTERM or Ctrl-C")
    ing.add_argument("--interval", type=_interval, default=60.0,
                     help="seconds between passes with --continuous (default 60)")
    ing.add_argument("--debug", action="store_true",
                     help="log at debug level, with the traceback of a pass that fails")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # The job's own messages from INFO, others' (py4j's: a traceback at INFO for each lost
    # connection when the JVM ends) from WARNING.
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("edgebroker").setLevel(logging.DEBUG if args.debug else logging.INFO)
    # Run directly (not by spark-submit), the Python workers use this interpreter, which has
    # pyarrow and edgebroker; spark-submit users set PYSPARK_PYTHON themselves.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from edgebroker.spark.files import PassRunning
    from edgebroker.spark.ingest import SESSION_CONFIG, ingest_once

    builder = SparkSession.builder.appName("edgebroker-ingest")
    for key, value in SESSION_CONFIG.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    failed, said = 0, None   # passes failed in a row; the error last logged
    try:
        while True:
            try:
                report = ingest_once(spark, args.landing, args.warehouse, args.checkpoint)
            except Exception as exc:
                if not args.continuous and isinstance(exc, PassRunning):
                    print(f"edgebroker-spark: {exc}", file=sys.stderr)
                    return 1
                log.debug("the failed pass's traceback:", exc_info=True)
                if not args.continuous:   # a cron job's or scheduler's mail: the error first
                    print(f"edgebroker-spark: ingest pass failed: {_one_line(exc)}",
                          file=sys.stderr)
                    return 1
                if stop.is_set():   # cut short by the stop: systemd's SIGTERM ends the JVM too
                    log.info("ingest pass cut short by SIGTERM: %s", _one_line(exc))
                    return 0
                gone = _spark_gone(spark)
                if gone:   # no later pass could work: exit for the service to be restarted
                    log.error("ingest pass failed and Spark is gone (%s), exiting: %s", gone,
                              _one_line(exc))
                    return 1
                # A landing area not mounted yet, a store unreachable for a while: logged once
                # (again only when the error changes), retried every interval.
                failed += 1
                error = _one_line(exc)
                if error != said:
                    log.error("ingest pass failed, retried every %gs: %s", args.interval, error)
                    said = error
            else:
                if failed:
                    log.warning("ingest pass succeeded again after %d failed", failed)
                    failed, said = 0, None
                print(json.dumps(report), flush=True)
            if not args.continuous or stop.wait(args.interval):
                return 0
    except KeyboardInterrupt:
        return 130
    finally:
        try:
            spark.stop()
        except Exception as exc:   # its JVM ended already (SIGTERM to the whole process group)
            log.info("Spark was stopped already: %s", _one_line(exc))


def _spark_gone(spark) -> str | None:
    """Why ``spark`` can no longer run a job (its JVM ended: the py4j call fails; its context
    stopped), or None while it can."""
    try:
        if spark.sparkContext._jsc.sc().isStopped():
            return "its SparkContext is stopped"
    except Exception as exc:   # py4j: the connection to the JVM refused or closed
        return f"its JVM does not answer: {_one_line(exc)}"
    return None


def _one_line(exc: BaseException) -> str:
    """The first line of an error (a Java one brings its whole stack trace), at most 500
    characters."""
    text = (str(exc).strip().splitlines() or [""])[0].strip()
    return f"{type(exc).__name__}: {text[:500]}"


if __name__ == "__main__":
    sys.exit(main())
