// Python objects imported through DLPack: see dlpack_views.hpp.
#include "dlpack_views.hpp"

#include <string>

namespace rope_python {
namespace {

// "numpy.ndarray", "torch.Tensor", "list": how messages name a Python object's type.
std::string python_type_name(nb::handle object) {
    nb::handle type = object.type();
    const std::string module = nb::hasattr(type, "__module__") ? nb::str(type.attr("__module__")).c_str() : "";
    const std::string name = nb::str(type.attr("__qualname__")).c_str();
    return module.empty() || module == "builtins" ? name : module + "." + name;
}

// Why @p object could not be imported: the most useful of three explanations.
[[noreturn]] void explain_import_failure(const std::string& name, nb::handle object) {
    const std::string type = python_type_name(object);
    if (!nb::hasattr(object, "__dlpack__") && !PyObject_CheckBuffer(object.ptr()))
        rope::fail(name, type,
                   "has no DLPack (__dlpack__) or buffer interface: pass a NumPy array, a PyTorch tensor or a "
                   "CuPy array");
    // The producer refused to export it: its own exception says why (a PyTorch
    // tensor that requires grad, a NumPy dtype DLPack cannot describe, ...).
    if (nb::hasattr(object, "__dlpack__")) {
        try {
            object.attr("__dlpack__")();
        } catch (nb::python_error& error) {
            rope::fail(name, type, std::string("its __dlpack__() failed: ") + error.what());
        }
    }
    rope::fail(name, type, "could not be imported through DLPack or the buffer protocol");
}

template <typename NbArray>
bool try_import(nb::handle object, NbArray& array) {
    // convert=false: never let nanobind make a converted copy; rope works on the caller's memory.
    return nb::try_cast(object, array, /*convert=*/false);
}

}  // namespace

InputArray import_input(const std::string& name, nb::handle object) {
    InputArray array;
    if (!try_import(object, array)) explain_import_failure(name, object);
    return array;
}

OutputArray import_output(const std::string& name, nb::handle object) {
    OutputArray array;
    if (try_import(object, array)) return array;
    // Importable for reading but not for writing: the producer marked it read-only.
    InputArray readable;
    if (try_import(object, readable))
        rope::fail(name, python_type_name(object) + " (read-only)",
                   "rope writes into it: pass a writable array (e.g. a copy), or an out= array");
    explain_import_failure(name, object);
}

}  // namespace rope_python
