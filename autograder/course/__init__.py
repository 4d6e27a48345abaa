"""The course's own tools: where things are (:mod:`.repository`), its settings (:mod:`.settings`),
and what makes the course from its one source: the release, the scaffold of a new notebook, the
student bundle. Nothing here runs student code."""
