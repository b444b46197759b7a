"""The management HTTP API (RabbitMQ's, issue 15) and the web console's files."""
