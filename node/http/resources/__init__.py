"""The management API's handlers, one module per resource family (as
RabbitMQ's rabbit_mgmt_wm_* modules); node/http/routes.py maps paths to them.
Each handler is `async (ctx, request, path parameters, principal) -> Response`."""
