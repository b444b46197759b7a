"""The project's real Kubernetes control plane for tests (issue 13): build.sh, control_plane.py."""
