"""What every Clarion process shares: settings, CLI, logging, metrics, the embedded dev runner."""
