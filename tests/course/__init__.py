"""The course's tools: the environment, the release, the scaffold, the bundle, the settings, the manual."""
