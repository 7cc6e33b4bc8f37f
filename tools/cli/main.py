"""The `tidemark` command: a thin shell over tools.operate.commands.

The configuration is read once (``tidemark.settings.load_settings``) and passed down as
``args.settings``. Errors print one line and exit non-zero (``--traceback`` shows the full
trace). The commands live by concern: tools/cli/reports.py (what reads), cli_decisions.py (what
a person decides), cli_series.py (series, kill, schedules), cli_stack.py (the laptop stack and
the harnesses); ``build_parser`` registers them.
"""

from __future__ import annotations

import argparse
import getpass
import os
import select
import sys
from collections.abc import Mapping, Sequence

from tidemark import installed_version
from tidemark.errors import InputError, TidemarkError, UnknownTask, one_line
from tidemark.import_names import check_import_names
from tidemark.process_exit import exit_now
from tidemark.settings import Settings, load_settings
from tools.cli.codec import add_codec_commands
from tools.cli.common import (
    EXIT_ERROR,
    EXIT_NOT_DONE,
    EXIT_USAGE,
    SUCCESS,
    UsageError,
    add_temporal_arguments,
    journal_url,
)
from tools.cli.decisions import add_decision_commands
from tools.cli.fleet import add_fleet_command
from tools.cli.inputs import check_arguments
from tools.cli.reports import add_report_commands
from tools.cli.series import add_series_commands
from tools.cli.stack import add_stack_commands
from tools.cli.start import add_start_command
from tools.operate import commands
from tools.operate.inbox import add_inbox_command

__all__ = ["EXIT_BROKEN_PIPE", "EXIT_ERROR", "EXIT_NOT_DONE", "EXIT_USAGE", "SUCCESS",
           "UsageError", "add_temporal_arguments", "build_parser", "command_settings", "main",
           "run"]

# The reader of stdout went away (`tidemark status T | head -1`): the command ends quietly with
# the status a shell gives a writer killed by SIGPIPE (128 + 13), so `set -o pipefail` scripts
# still see that the output was cut short.
EXIT_BROKEN_PIPE = 141

# The commands that are a laptop stack or a test harness: they may use the embedded Postgres
# when DATABASE_URL is unset. Every other command needs DATABASE_URL or --embedded-db.
EMBEDDED_COMMANDS = ("dev", "demo", "chaos", "fleet")


def command_settings(a: argparse.Namespace, env: Mapping[str, str] | None = None) -> Settings:
    """The settings of this command line.

    They are the environment's, with the embedded database allowed for the commands that are a
    dev stack or a harness (or with --embedded-db), and the Temporal flags applied. The Temporal
    profile is loaded here for the commands that take the Temporal flags (they connect, after
    changing the journal), and on first use for the others."""
    settings = load_settings(env, embedded_db=a.embedded_db or a.command in EMBEDDED_COMMANDS,
                             lazy_temporal=not hasattr(a, "address"))
    return settings.with_temporal(address=getattr(a, "address", None),
                                  namespace=getattr(a, "namespace", None))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tidemark",
        description="Crash-safe, idempotent execution of agent plans. The journal lives in "
                    "DATABASE_URL; `tidemark dev`, `demo` and `chaos` use an embedded "
                    "Postgres when it is unset, other commands only with --embedded-db.")
    p.add_argument("--version", action=_Version,
                   help="show program's version number and exit")
    p.add_argument("--traceback", action="store_true", help="show the full trace on errors")
    p.add_argument("--embedded-db", action="store_true",
                   help="without DATABASE_URL, use the embedded Postgres in $TIDEMARK_HOME "
                        "(as TIDEMARK_EMBEDDED_DB=1 does)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_report_commands(sub)
    add_start_command(sub)
    user = getpass.getuser()
    add_decision_commands(sub, user)
    add_stack_commands(sub)
    add_series_commands(sub, user)
    add_inbox_command(sub)
    add_fleet_command(sub)
    add_codec_commands(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_import_names()
        check_arguments(args)  # before anything is read or written
        args.settings = command_settings(args)
        if getattr(args, "task_queue", "") is None:
            args.task_queue = args.settings.task_queue
        return int(args.func(args))
    except UsageError as e:
        parser.print_usage(sys.stderr)
        print(f"tidemark: {e}", file=sys.stderr)
        return EXIT_USAGE
    except InputError as e:  # too long, a character the journal cannot hold, undecodable JSON
        if args.traceback:
            raise
        print(f"tidemark: {one_line(str(e))}; nothing was done", file=sys.stderr)
        return EXIT_USAGE
    except TidemarkError as e:
        if args.traceback:
            raise
        said = one_line(f"{e}{_unknown_hint(args, e)}")  # what it quotes may be anybody's
        print(f"tidemark: {type(e).__name__}: {said}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as e:
        schema = None if args.traceback else _schema_behind(e)
        if schema is None:
            raise
        print(f"tidemark: {schema} (a worker does on start)", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


def _schema_behind(e: Exception) -> str | None:
    """What to say when Postgres finds no such table or column in the journal.

    Either there is no schema yet, or one older than this version (a command that reads does not
    migrate). None for any other error. The driver is loaded by the commands that use the
    journal, not by this module: a command that never read it (`--help`, one that failed before
    it connected) does not load it just to be told apart."""
    psycopg = sys.modules.get("psycopg")
    if psycopg is None:
        return None
    if isinstance(e, psycopg.errors.UndefinedTable):
        return ("the journal database has no Tidemark schema yet: `tidemark db migrate` "
                "creates it")
    if isinstance(e, psycopg.errors.UndefinedColumn):
        return ("the journal database's schema is older than this version of Tidemark: "
                "`tidemark db migrate` brings it up to date")
    return None


def _unknown_hint(a: argparse.Namespace, e: TidemarkError) -> str:
    """What blocked or refused the start of a task no plan is stored for.

    For a task whose start its series blocked: what blocked it (a person at 03:14 must not take
    the run for a typo). For one whose start was refused before its plan was stored: what
    refused it (what its worklist row says)."""
    if not isinstance(e, UnknownTask):
        return ""
    import psycopg  # loaded already: the journal said the task is unknown

    try:
        return "; " + commands.blocked_status(journal_url(a), e.task_id)["line"]
    except (TidemarkError, psycopg.Error):
        pass
    from tools.operate.inbox import refused_line

    said = refused_line(journal_url(a), e.task_id)
    return "" if said is None else f"; {said}"


class _Version(argparse.Action):
    """--version, which reads the installed version when it is asked for.

    It calls installed_version then, not each time the parser is built."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0,
                         help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        print(f"tidemark {installed_version()}")
        parser.exit()


def run() -> None:
    """The ``tidemark`` command: main(), then the exit of tidemark.process_exit.

    A closed stdout ends it quietly with EXIT_BROKEN_PIPE."""
    try:
        code = _main_code()
        sys.stdout.flush()  # what is still buffered meets a closed pipe here, not at exit
    except BrokenPipeError:
        if not _stdout_closed():  # a broken socket to Postgres or Temporal is no quiet matter
            raise
        # Nothing more can be said on stdout: point it at /dev/null so that the final flush
        # of exit_now finds nowhere to fail.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = EXIT_BROKEN_PIPE
    exit_now(code)


def _main_code() -> int:
    try:
        return main()
    except SystemExit as e:  # argparse's --help, --version and usage errors
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader went away (poll reports an error on its end)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


if __name__ == "__main__":
    run()
