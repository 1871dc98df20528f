"""`accel verify`: a study's top trials and its baseline rerun over fresh seeds, with intervals."""

from accel.verify.command import cli_verify

__all__ = ["cli_verify"]
