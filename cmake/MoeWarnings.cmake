# Warnings on for our own targets; -Werror when MOE_WERROR (CI turns it on).
function(moe_set_warnings tgt)
  target_compile_options(${tgt} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wstrict-prototypes
                         -Wmissing-prototypes -Wno-unused-parameter)
  if(MOE_WERROR)
    target_compile_options(${tgt} PRIVATE -Werror)
  endif()
  if(MOE_SANITIZE)
    target_compile_options(${tgt} PRIVATE -fsanitize=address,undefined -fno-omit-frame-pointer
                           -fno-sanitize-recover=undefined)
    target_link_options(${tgt} PRIVATE -fsanitize=address,undefined)
  endif()
endfunction()

if(MOE_SANITIZE)
  add_link_options(-fsanitize=address,undefined)
endif()
