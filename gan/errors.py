"""The errors a user can cause: each message is one paragraph naming the key or path at fault and what to do, and
the entry points turn any of them into exit code 2 (bad input). Anything else is a bug, and keeps its traceback."""


class UserError(RuntimeError):
    """Bad input: a config value, a checkpoint, a dataset, an output folder or a measurement that cannot be made."""


class ConfigError(UserError, ValueError):
    """A config value that has the right type but cannot be used; the message names the key."""


class CheckpointError(UserError):
    """A checkpoint that cannot be used; the message names the file and what is wrong with it."""


class DataError(UserError):
    """A dataset that cannot be loaded; the message says where it looked and what it expected."""


class MetricsError(UserError):
    """A measurement that cannot be made honestly; the message says why and what to change."""


def environment_error(err: OSError) -> UserError:
    """An OSError (disk full, no permission, a file that vanished) as a UserError naming the file."""
    where = f" {err.filename}" if err.filename else ""
    reason = err.strerror or str(err) or type(err).__name__
    return UserError(
        f"The operating system refused a file operation on{where or ' a file'}: {reason} (errno {err.errno}). "
        "Free disk space or fix the permissions and run the same command again; checkpoints are written "
        "atomically, so the last one written before this is intact."
    )


class RunDirError(UserError):
    """A run directory that cannot be used now: another process holds it, or a new run would replace its run."""
