# Warnings on for our own targets; -Werror when MOE_WERROR (CI turns it on). C and C++ sources (the
# simulator compiles the kernels as C++) get the host compiler's warnings; CUDA sources get nvcc's
# own plus the host compiler's through -Xcompiler (moe_set_cuda_warnings).
function(moe_set_warnings tgt)
  target_compile_options(${tgt} PRIVATE
    $<$<COMPILE_LANGUAGE:C,CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wno-unused-parameter>
    $<$<COMPILE_LANGUAGE:C>:-Wstrict-prototypes -Wmissing-prototypes>)
  if(MOE_WERROR)
    target_compile_options(${tgt} PRIVATE $<$<COMPILE_LANGUAGE:C,CXX>:-Werror>)
  endif()
  if(MOE_SANITIZE)
    target_compile_options(${tgt} PRIVATE $<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=address,undefined
                           -fno-omit-frame-pointer -fno-sanitize-recover=undefined>)
    target_link_options(${tgt} PRIVATE -fsanitize=address,undefined)
  endif()
endfunction()

function(moe_set_cuda_warnings tgt)
  target_compile_options(${tgt} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wno-unused-parameter --Wreorder
      --Wno-deprecated-gpu-targets>)
  if(MOE_WERROR)
    target_compile_options(${tgt} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Werror>)
  endif()
endfunction()

if(MOE_SANITIZE)
  add_link_options(-fsanitize=address,undefined)
endif()
