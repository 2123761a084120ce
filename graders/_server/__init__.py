"""The reward server: one grader behind the HTTP contracts of Bailian, DashScope, Vertex Cloud Run and OpenRLHF."""
