// padfree._hostpack: padfree.Runtime's input packing below Python.
//
// pack(seqs, upper, pad_id, max_len) lays a batch of token sequences end to end as int32 and checks
// every id in the same pass: one C loop over the batch where the Python path spends a numpy
// conversion and several whole-array passes (runtime/_inputs.py). It takes what a well-formed batch
// is: a list or tuple whose items are each a list or tuple of Python ints (exactly int) or a 1-D
// integer buffer (a numpy array). It returns (ids, cu_seqlens, lengths, longest): bytes of int32
// [total_tokens], int64 [batch + 1] and int64 [batch], and the longest length; or None for anything
// else: another form, an empty sequence or one longer than max_len, a bool / float / int subclass /
// numpy scalar / nested item, an id outside [0, upper) or equal to pad_id. On None the caller runs the
// Python path, which accepts the batch or raises the error naming the sequence and position: this
// module never decides a message.
//
// Memory safety against the batch's own code: Python code the batch brings (a class's __buffer__, a
// finalizer run by an allocation's garbage collection) may change its lists while this runs. The
// sequences are held through a snapshot of the batch, every buffer is taken before any list is read,
// and the lists are read in a pass that runs no Python code, each length checked against the one
// counted: a list changed underneath declines the batch, never reads freed or stale memory.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace {

// One sequence of the batch: a list / tuple of Python ints, or a 1-D buffer of native integers.
struct Source {
  PyObject* seq = nullptr;  // borrowed from the batch's snapshot, which holds a reference
  Py_buffer view{};         // buffer form (released by Sources)
  bool is_buffer = false;
  Py_ssize_t length = 0;
};

class Sources {
 public:
  std::vector<Source> all;
  ~Sources() {
    for (Source& s : all)
      if (s.is_buffer) PyBuffer_Release(&s.view);
  }
};

// The element size of an integer buffer format numpy or array.array produce, 0 for anything else.
// uint64 ('L', 'Q') is left to the Python path: its values past int64 need their own message.
Py_ssize_t integer_format_size(const char* format, bool* is_signed) {
  if (format == nullptr) return 1;  // PEP 3118: no format means unsigned bytes
  if (*format == '@' || *format == '=' || *format == '<') ++format;  // native order (x86-64, aarch64: little)
  if (format[0] == '\0' || format[1] != '\0') return 0;
  switch (format[0]) {
    case 'b': *is_signed = true; return 1;
    case 'B': *is_signed = false; return 1;
    case 'h': *is_signed = true; return 2;
    case 'H': *is_signed = false; return 2;
    case 'i': *is_signed = true; return 4;
    case 'I': *is_signed = false; return 4;
    case 'l': *is_signed = true; return sizeof(long) == 8 ? 8 : 0;
    case 'q': *is_signed = true; return 8;
    default: return 0;
  }
}

bool is_list_form(PyObject* seq) { return PyList_CheckExact(seq) || PyTuple_CheckExact(seq); }

// A sequence that is not a list or tuple, as a 1-D integer buffer. This may run Python code (a class's
// __buffer__, Python 3.12+), which may change any list of the batch: no list is read before every
// buffer is held.
bool open_buffer(PyObject* seq, Source* s) {
  // bytes are text to the Python path (numpy reads them as one string), not uint8 ids
  if (!PyObject_CheckBuffer(seq) || PyBytes_Check(seq) || PyByteArray_Check(seq)) return false;
  if (PyObject_GetBuffer(seq, &s->view, PyBUF_RECORDS_RO) != 0) {
    PyErr_Clear();
    return false;
  }
  s->is_buffer = true;
  bool is_signed = false;
  Py_ssize_t size = integer_format_size(s->view.format, &is_signed);
  if (s->view.ndim != 1 || size == 0 || size != s->view.itemsize) return false;
  s->length = s->view.shape[0];
  return true;
}

template <typename T>
bool copy_buffer(const Py_buffer& view, Py_ssize_t length, long long upper, long long pad_id, int32_t* out) {
  const char* p = static_cast<const char*>(view.buf);
  const Py_ssize_t stride = view.strides ? view.strides[0] : static_cast<Py_ssize_t>(sizeof(T));
  bool ok = true;
  for (Py_ssize_t i = 0; i < length; ++i, p += stride) {
    T raw;
    std::memcpy(&raw, p, sizeof(T));  // buffers need not be aligned
    const long long v = static_cast<long long>(raw);
    ok &= (v >= 0) & (v < upper) & (v != pad_id);  // branch-free: the loop stays vectorizable
    out[i] = static_cast<int32_t>(v);
  }
  return ok;
}

// Runs no Python code: a list's items are exact ints (never an int subclass or an object with
// __index__, whose methods could change the list being read; the Python path takes those), and the
// list is read as it is now, its length checked against the one counted.
bool copy_source(const Source& s, long long upper, long long pad_id, int32_t* out) {
  if (!s.is_buffer) {
    if (PySequence_Fast_GET_SIZE(s.seq) != s.length) return false;
    PyObject* const* items = PySequence_Fast_ITEMS(s.seq);
    for (Py_ssize_t i = 0; i < s.length; ++i) {
      if (!PyLong_CheckExact(items[i])) return false;
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(items[i], &overflow);
      if (overflow != 0 || v < 0 || v >= upper || v == pad_id) return false;
      out[i] = static_cast<int32_t>(v);
    }
    return true;
  }
  bool is_signed = false;
  switch (integer_format_size(s.view.format, &is_signed)) {
    case 1: return is_signed ? copy_buffer<int8_t>(s.view, s.length, upper, pad_id, out)
                             : copy_buffer<uint8_t>(s.view, s.length, upper, pad_id, out);
    case 2: return is_signed ? copy_buffer<int16_t>(s.view, s.length, upper, pad_id, out)
                             : copy_buffer<uint16_t>(s.view, s.length, upper, pad_id, out);
    case 4: return is_signed ? copy_buffer<int32_t>(s.view, s.length, upper, pad_id, out)
                             : copy_buffer<uint32_t>(s.view, s.length, upper, pad_id, out);
    default: return copy_buffer<int64_t>(s.view, s.length, upper, pad_id, out);
  }
}

PyObject* pack(PyObject*, PyObject* args) {
  PyObject* batch;
  long long upper, pad_id, max_len;
  if (!PyArg_ParseTuple(args, "OLLL", &batch, &upper, &pad_id, &max_len)) return nullptr;
  if (upper < 0 || upper > (1LL << 31)) {
    PyErr_SetString(PyExc_ValueError, "upper must be in [0, 2**31]: ids travel as int32");
    return nullptr;
  }
  if (!is_list_form(batch) || PySequence_Fast_GET_SIZE(batch) == 0) Py_RETURN_NONE;
  // a reference to every sequence for the whole call, whatever Python code run below does to the batch
  PyObject* snapshot = PySequence_Tuple(batch);
  if (snapshot == nullptr) return nullptr;
  const Py_ssize_t count = PyTuple_GET_SIZE(snapshot);
  Sources sources;
  sources.all.resize(count);
  const Py_ssize_t word = static_cast<Py_ssize_t>(sizeof(int64_t));
  PyObject* cu = PyBytes_FromStringAndSize(nullptr, (count + 1) * word);
  PyObject* lengths = PyBytes_FromStringAndSize(nullptr, count * word);
  PyObject* ids = nullptr;
  PyObject* result = nullptr;
  if (cu == nullptr || lengths == nullptr) goto done;
  {
    // 1. every buffer held (the only step that runs Python code of the batch's own)
    for (Py_ssize_t i = 0; i < count; ++i) {
      Source& s = sources.all[i];
      s.seq = PyTuple_GET_ITEM(snapshot, i);
      if (!is_list_form(s.seq) && !open_buffer(s.seq, &s)) {
        result = Py_NewRef(Py_None);
        goto done;
      }
    }
    // 2. the lengths
    int64_t* cu_seqlens = reinterpret_cast<int64_t*>(PyBytes_AS_STRING(cu));
    int64_t* seqlens = reinterpret_cast<int64_t*>(PyBytes_AS_STRING(lengths));
    long long longest = 0;
    cu_seqlens[0] = 0;
    for (Py_ssize_t i = 0; i < count; ++i) {
      Source& s = sources.all[i];
      if (!s.is_buffer) s.length = PySequence_Fast_GET_SIZE(s.seq);
      if (s.length < 1 || s.length > max_len) {
        result = Py_NewRef(Py_None);
        goto done;
      }
      seqlens[i] = s.length;
      cu_seqlens[i + 1] = cu_seqlens[i] + s.length;
      if (s.length > longest) longest = s.length;
    }
    // 3. the ids: an allocation (which may collect garbage and so run finalizers), then the copy,
    // which runs no Python code and reads each list afresh
    ids = PyBytes_FromStringAndSize(nullptr, cu_seqlens[count] * static_cast<Py_ssize_t>(sizeof(int32_t)));
    if (ids == nullptr) goto done;
    int32_t* out = reinterpret_cast<int32_t*>(PyBytes_AS_STRING(ids));
    for (Py_ssize_t i = 0; i < count; ++i) {
      if (!copy_source(sources.all[i], upper, pad_id, out + cu_seqlens[i])) {
        result = Py_NewRef(Py_None);
        goto done;
      }
    }
    result = Py_BuildValue("(OOOL)", ids, cu, lengths, longest);
  }
done:
  Py_XDECREF(ids);
  Py_XDECREF(cu);
  Py_XDECREF(lengths);
  Py_DECREF(snapshot);
  return result;
}

PyMethodDef methods[] = {
    {"pack", pack, METH_VARARGS,
     "pack(seqs, upper, pad_id, max_len) -> (ids, cu_seqlens, lengths, longest) or None: the sequences end to end"
     " (bytes of int32 [total_tokens], int64 [batch + 1], int64 [batch]), each of 1 to max_len ids, every id"
     " in [0, upper) and != pad_id (-1: none)."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_hostpack", "padfree.Runtime's input packing below Python (see hostpack.cpp).",
                      -1, methods, nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__hostpack() { return PyModule_Create(&module); }
