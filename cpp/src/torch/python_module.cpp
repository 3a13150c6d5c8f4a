// `import cutlassfuse._C` loads this library, whose static initialisers register the
// operators with torch.ops.cutlassfuse. The module itself holds nothing.
#include <Python.h>

extern "C" PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C",
                               "cutlassfuse's compiled operators, registered as torch.ops.cutlassfuse.*", -1, nullptr};
  return PyModule_Create(&module);
}
