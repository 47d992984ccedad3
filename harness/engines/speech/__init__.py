"""Speech engines: text in, an audio stream out, speaking a voice of harness/voices.py.

    base.py     what they share: one fresh worker per run, every chunk stamped, the metrics from the stamps, the
                settings read back, the libraries checked
    piper.py    Piper (piper-tts) on the ONNX Runtime wheel
    sherpa.py   sherpa-onnx's OfflineTts (VITS) on its own ONNX Runtime, the same voice file
    cli.py      Piper's own command line as the measured process, read by a plain client (the cross-check)
    worker.py   the worker (with server.py, the only modules that import piper or sherpa_onnx)
    server.py   the speech server a served run starts around the engine (an OpenAI-style /v1/audio/speech)
    served.py   a served run: the server started, the client's load sent (harness/workloads/speech/client.py)
    external.py `openai-speech`: an OpenAI-style speech endpoint the harness does not start, sent the load
"""
