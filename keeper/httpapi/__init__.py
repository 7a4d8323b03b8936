"""What every HTTP API we serve shares: the app factory, exo's error envelope, who may change the
cluster, the deployments routes, and serving an app beside a service's own loops.
"""
