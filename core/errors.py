"""The one kind of error the `simplan` command reports as the user's to fix: `UsageError`.

scripts/cli.py catches every exception once: a `UsageError` (a flag, a path or an input that cannot work; its
message says what, where and what to do) exits 2 with its message; anything else exits 1 with one line and
the path of the saved traceback. `UsageError` is a mixin, so each error keeps the builtin base its callers
already catch:

    class UnknownEnvError(UsageError, LookupError): ...          # envs/registry.py
    raise OutputPathError(f"--out {path}: is a file, not a folder; give a folder path")
"""

from __future__ import annotations


class UsageError(Exception):
    """A mistake in what was asked (a flag, a path, an input file), not a failure of the work: exit status 2."""


class OutputPathError(UsageError, ValueError):
    """An output path that cannot be written: a file where a folder is wanted, a path under a file, a folder
    that is read-only or on a full disk. Raised before any work starts (core/io.py `check_output_folder`)."""


class EmptyInputError(UsageError, ValueError):
    """An input file with no line to read (empty, or only blank lines)."""


class MissingInputError(UsageError, FileNotFoundError):
    """An input the user named (a file, a folder, a run) that does not exist; the message says how to make it."""


class InputError(UsageError, ValueError):
    """An input the user gave that cannot be used as it is (a dataset without the fold asked for, a suite file
    with an unknown key, predictions without a column): the message says what is wrong and what to do."""


class MissingPackageError(UsageError, ImportError):
    """An optional package an env or a backend needs is not installed: the message says what to install."""
