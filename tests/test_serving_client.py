"""serving.client's command line against a running server."""
import json


from serving import client




def test_client_command_line_prints_answers_and_provenance(qa_server, capsys):
  server, _, _ = qa_server
  address = f"127.0.0.1:{server.port}"
  assert client.main(["--server", address, "--top_blocks", "2", "who wrote the iliad?"]) == 0
  printed = capsys.readouterr().out
  assert printed.startswith("Q: who wrote the iliad?\nA: v1:WHO WROTE THE ILIAD? (score ")
  assert "p(z|x)=" in printed and "← answer" in printed and "Title " in printed
  assert client.main(["--server", address, "--json", "a", "b"]) == 0
  answers = json.loads(capsys.readouterr().out)
  assert [a["question"] for a in answers] == ["a", "b"]
  assert client.main(["--server", address, "--model", "nope", "a"]) == 1
  assert "NOT_FOUND" in capsys.readouterr().err
