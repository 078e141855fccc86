"""Data shared by the API and the workers: tables, migrations, Kafka message contracts."""
