"""`make docker-check` (`python -m checks.docker`), one module per concern: `settings` (the project,
images, stand-ins), `helpers` (pure or nearly so), `machine` (the check's state and its dealings
with docker), `checks` (what is asserted of each study)."""
