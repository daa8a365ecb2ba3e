"""kern-run's refusals: what the person running `kern` must fix, said in one line.

`RefusalError` carries a message that names the bad value and what to do about it; the CLI prints it as
one line on stderr and exits with `exit_code`. Errors from kern-runtime (`kern_runtime.KernError` and its
variants) pass through the CLI the same way, prefixed with their class name.
"""

from __future__ import annotations


class RefusalError(Exception):
    """`kern` cannot proceed with these inputs; `str(err)` is one line saying what to fix."""

    exit_code = 2


class NoDeviceError(RefusalError):
    """No usable CUDA device (no driver, no device, or --gpu out of range)."""

    exit_code = 3


class ConfigError(RefusalError):
    """kern.toml / flags do not give a usable target (missing file, unknown target, bad value)."""


class KernelsError(RefusalError):
    """The kernels directory lacks a cubin the manifest pins, or holds a different one."""


class WeightsError(RefusalError):
    """The checkpoint does not match the manifest's weight binds (missing tensor, wrong dtype or shape)."""


class InputError(RefusalError):
    """The prompt or generation options do not fit the manifest or the capacity."""


class ManifestBuildError(RefusalError):
    """A manifest builder (kern_run.models) cannot make a manifest from this config.json, kernels.json, pins
    file or these options; the message names the file and key, or the option (`field (--flag) value`)."""

    exit_code = 1


class SamplingError(InputError):
    """A sampling parameter outside its range (kern_run.sampling): names the field, the value and the range."""
