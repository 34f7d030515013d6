"""Evaluation: suites, fault injection, the concurrent runner, metrics from traces, paired statistics, loss
classes, reports, and offline model evaluation."""
