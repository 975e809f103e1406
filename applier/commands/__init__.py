"""CLI subcommands, one module each. Each module defines ``register(subparsers)`` which adds its parser
and sets ``func`` to a callable taking the parsed args and returning the exit code."""

#: Modules (under applier.commands) whose subcommands `applier` offers, in --help order.
COMMAND_MODULES: tuple[str, ...] = (
    "setup",
    "demo",
    "mirror",
    "resync",
    "capture",
    "replay",
    "verify",
    "status",
    "cut",
    "maintain",
    "inspect",
)
