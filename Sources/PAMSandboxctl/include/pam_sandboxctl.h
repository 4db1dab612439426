#ifndef PAM_SANDBOXCTL_H
#define PAM_SANDBOXCTL_H

// pam_sandboxctl: hands the password typed at login to the user's key daemon as the device's unlock (auth), and a
// changed login password to it as a passcode change (password). See docs/SECURITY.md, "The PAM module".
// The entry points are PAM's own (pam_sm_authenticate, pam_sm_setcred, pam_sm_chauthtok); nothing else is exported.

#endif
