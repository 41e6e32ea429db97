# berth code-context driver (docs/contexts.md). berthd runs it as
# `python3 -c SOURCE`: nothing is written into the sandbox. It reads one
# JSON line per cell on stdin ({"cell": ID, "code": SOURCE}) and writes JSON
# lines on a private descriptor (a duplicate of its original stdout, which
# no cell can reach: fd 1 and fd 2 are pipes the driver reads), so a cell's
# output, whatever it holds, is only data inside a frame. Frames:
#   {"cell": ID, "type": "stdout"|"stderr", "text": ...}
#   {"cell": ID, "type": "result", "data": {MIME: TEXT}, "main": BOOL}
#     (binary MIME types, image/png, are base64)
#   {"cell": ID, "type": "error", "name": ..., "value": ..., "traceback": [...]}
#   {"cell": ID, "type": "done"}
import ast, base64, codecs, io, json, linecache, os, select, signal, sys, threading, traceback

os.environ.setdefault("MPLBACKEND", "Agg")
_proto = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
_lock = threading.Lock()
_cell = [None]
_running = [False]


def _emit(frame):
    with _lock:
        _proto.write(json.dumps(frame) + "\n")
        _proto.flush()


class _Reader(threading.Thread):
    """Reads one of the cell's streams (a pipe on fd 1 or 2) and emits it
    tagged with the running cell. drain() returns once every byte written
    before the call was emitted."""

    def __init__(self, name, fd):
        super().__init__(daemon=True)
        self.name_ = name
        self.r, self.w = os.pipe()
        self.wake_r, self.wake_w = os.pipe()
        self.drained = threading.Event()
        self.target = fd
        os.set_inheritable(self.w, False)

    def attach(self):
        os.dup2(self.w, self.target)

    def _read(self, block):
        os.set_blocking(self.r, block)
        try:
            return os.read(self.r, 65536)
        except BlockingIOError:
            return b""

    def run(self):
        dec = codecs.getincrementaldecoder("utf-8")("replace")
        while True:
            ready, _, _ = select.select([self.r, self.wake_r], [], [])
            if self.r in ready:
                data = self._read(False)
                if data:
                    _emit({"cell": _cell[0], "type": self.name_, "text": dec.decode(data)})
            if self.wake_r in ready:
                os.read(self.wake_r, 1)
                while True:
                    data = self._read(False)
                    if not data:
                        break
                    _emit({"cell": _cell[0], "type": self.name_, "text": dec.decode(data)})
                self.drained.set()

    def drain(self):
        self.drained.clear()
        os.write(self.wake_w, b"x")
        self.drained.wait()


_out = _Reader("stdout", 1)
_err = _Reader("stderr", 2)
devnull = os.open(os.devnull, os.O_RDONLY)
_stdin = os.fdopen(os.dup(0), "r", encoding="utf-8")
os.dup2(devnull, 0)
for r in (_out, _err):
    r.attach()
    r.start()


def _streams():
    # A cell may have closed or replaced fd 1/2 or sys.stdout/sys.stderr.
    _out.attach()
    _err.attach()
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True)
    sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True)


_BINARY = ("image/png", "image/jpeg")


def _bundle(obj):
    data = {}
    for mime, meth in (("image/png", "_repr_png_"), ("image/jpeg", "_repr_jpeg_"), ("image/svg+xml", "_repr_svg_"),
                       ("text/html", "_repr_html_"), ("text/markdown", "_repr_markdown_"), ("text/latex", "_repr_latex_"),
                       ("application/json", "_repr_json_")):
        f = getattr(obj, meth, None)
        if f is None or isinstance(obj, type):
            continue
        try:
            v = f()
        except Exception:
            continue
        if v is None:
            continue
        if isinstance(v, tuple):
            v = v[0]
        if mime in _BINARY:
            v = base64.b64encode(v if isinstance(v, bytes) else v.encode()).decode()
        elif mime == "application/json":
            v = json.dumps(v)
        data[mime] = v
    try:
        data["text/plain"] = repr(obj)
    except Exception as e:
        data["text/plain"] = "<repr failed: %r>" % e
    return data


def display(*objs):
    """display publishes each object as a rich result of the running cell."""
    for o in objs:
        sys.stdout.flush()
        sys.stderr.flush()
        _out.drain()
        _err.drain()
        _emit({"cell": _cell[0], "type": "result", "data": _bundle(o), "main": False})


_ns = {"__name__": "__main__", "__builtins__": __builtins__, "display": display}


def _figures():
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    for num in plt.get_fignums():
        fig = plt.figure(num)
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        _emit({"cell": _cell[0], "type": "result", "main": False,
               "data": {"image/png": base64.b64encode(buf.getvalue()).decode(), "text/plain": repr(fig)}})
    plt.close("all")


def _run(code):
    tree = ast.parse(code, "<cell>", "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, "<cell>", "exec"), _ns)
    if last is not None:
        return eval(compile(last, "<cell>", "eval"), _ns)
    return None


def _sigint(signum, frame):
    if _running[0]:
        raise KeyboardInterrupt
    # Between cells an interrupt has nothing to stop.


signal.signal(signal.SIGINT, _sigint)


def main():
    while True:
        try:
            line = _stdin.readline()
        except KeyboardInterrupt:
            continue
        if not line:
            return
        try:
            req = json.loads(line)
            cell, code = req["cell"], req["code"]
        except Exception as e:
            _emit({"cell": None, "type": "error", "name": "ProtocolError", "value": str(e), "traceback": []})
            continue
        _cell[0] = cell
        _streams()
        # Tracebacks show the cell's lines.
        linecache.cache["<cell>"] = (len(code), None, code.splitlines(True), "<cell>")
        value, err = None, None
        try:
            _running[0] = True
            value = _run(code)
        except BaseException as e:  # KeyboardInterrupt and SystemExit too: the context lives on
            _running[0] = False
            tb = traceback.format_exception(type(e), e, e.__traceback__)
            # Leave out the driver's own frames.
            tb = [l for l in tb if not l.startswith('  File "') or l.startswith('  File "<cell>"')]
            err = {"cell": cell, "type": "error", "name": type(e).__name__, "value": str(e), "traceback": tb}
        finally:
            _running[0] = False
        try:
            if value is not None and err is None:
                _ns["_"] = value
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                except Exception:
                    pass
                _emit_after_drain({"cell": cell, "type": "result", "data": _bundle(value), "main": True})
            _figures()
        except BaseException as e:
            if err is None:
                err = {"cell": cell, "type": "error", "name": type(e).__name__, "value": str(e),
                       "traceback": traceback.format_exception(type(e), e, e.__traceback__)}
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            pass
        _streams()
        _out.drain()
        _err.drain()
        if err is not None:
            _emit(err)
        _emit({"cell": cell, "type": "done"})
        _cell[0] = None


def _emit_after_drain(frame):
    _out.drain()
    _err.drain()
    _emit(frame)


main()
