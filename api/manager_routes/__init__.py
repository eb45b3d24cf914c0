"""The manager's routes, one router per group; ``api/manager_app.create_app`` composes them."""
